"""Layer stacks run in cycles (scaffold.detect.recurrence), read from what the forward computes: transformers'
HrmText (an L stack run L_cycles times, then an H stack, in H_cycles cycles) and a lab's model that names, nests and
orders its stacks otherwise (the slow stack first, a while loop bounded by an attribute copied from the config, a
config alias, a third term in one input); and the refusal forms.repeated_stack words from the reading."""

from __future__ import annotations

import re

from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import forms, recurrence

# A lab's two-speed model: a tower class holding its blocks, built twice under other names; the slow tower runs
# first in each round, then the fast one a number of times given by an attribute copied from the config, in a
# while loop under a no_grad block; the fast input sums three terms, one of them converted with .to().
LAB_TOWERS = LAB_PRELUDE + '''class LabBlock(nn.Module):
    def __init__(self, config, index):
        super().__init__()
        self.norm = LabRMSNorm(config.hidden_size)
        self.wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x):
        q, k, v = self.wqkv(self.norm(x)).chunk(3, dim=-1)
        return x + self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True))


class Tower(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.blocks_per_tower)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class TwoSpeedModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.slow = Tower(config)
        self.fast = Tower(config)
        self.inner = config.fast_steps

    def forward(self, ids):
        cfg = self.config
        rounds = cfg.rounds
        x = self.embed(ids)
        slow = x
        fast = torch.zeros_like(x)
        for r in range(rounds):
            slow = self.slow(slow + fast)
            i = 0
            with torch.no_grad():
                while i < self.inner:
                    fast = self.fast(fast + slow.to(x.dtype) + x)
                    i += 1
        return slow
'''

CONFIG = {"rounds": 2, "fast_steps": 4, "blocks_per_tower": 3}


def test_hrm_text_reads_the_loops_stacks_and_sums():
    found = recurrence.read(transformers_code("hrm_text"))
    assert found.owner == "HrmTextModel" and found.file == "modeling_hrm_text.py"
    assert found.loop.key == "H_cycles" and found.loop.head == "for high_cycle_idx in range(self.config.H_cycles)"
    low, high = found.calls
    assert (low.attr, low.stack, low.layers, low.layer_class, low.length_key) == (
        "L_module", "HrmTextStack", "layers", "HrmTextDecoderLayer", "num_layers_per_stack")
    assert [loop.key for loop in low.loops] == ["H_cycles", "L_cycles"]
    assert low.inputs == ("hidden_states_low_cycle", "hidden_states_high_cycle")  # .to(device) taken off
    assert low.output == "hidden_states_low_cycle"
    assert (high.attr, [loop.key for loop in high.loops]) == ("H_module", ["H_cycles"])
    assert high.inputs == ("hidden_states_high_cycle", "hidden_states_low_cycle")
    assert high.output == "hidden_states_high_cycle" and high.line > low.line
    assert found.initial == {"hidden_states_high_cycle": "inputs_embeds", "hidden_states_low_cycle": "self.z_L_init"}
    # z_L_init is an nn.Parameter of the model (stored in the checkpoint); each stack ends with its final_norm; the
    # forward returns BaseModelOutputWithPast(last_hidden_state=<the H stack's state>).
    assert found.held == {"hidden_states_low_cycle": ("z_L_init", "parameter", 408)}
    assert low.after == high.after == ("final_norm", "HrmTextRMSNorm", 302)
    assert found.result == "hidden_states_high_cycle"
    config = {"H_cycles": 2, "L_cycles": 3, "num_layers_per_stack": 3}
    # Each layer position runs H * L times in the L stack and H times in the H stack: 3 * 8 = 24 caches, which is
    # what transformers' cycle_offset addresses (num_hidden_layers = num_layers_per_stack * H * (L + 1)).
    assert (low.runs(config), high.runs(config), found.attention_steps(config)) == (6, 2, 8)
    assert found.attention_steps({"H_cycles": 2}) is None  # a bound config.json does not set: not counted


def test_a_lab_with_other_names_order_and_loops_is_read_the_same_way():
    found = recurrence.read({"modeling_lab.py": LAB_TOWERS})
    assert found.owner == "TwoSpeedModel" and found.loop.key == "rounds"  # `rounds = cfg.rounds`, cfg the config
    slow, fast = found.calls
    assert (slow.attr, slow.stack, slow.layers, slow.layer_class, slow.length_key) == (
        "slow", "Tower", "blocks", "LabBlock", "blocks_per_tower")
    assert slow.inputs == ("slow", "fast") and [loop.key for loop in slow.loops] == ["rounds"]
    assert fast.inputs == ("fast", "slow", "x")
    assert [loop.key for loop in fast.loops] == ["rounds", "fast_steps"]  # `while i < self.inner`, copied from config
    assert fast.loops[1].head == "while i < self.inner"
    assert found.initial == {"slow": "x", "fast": "torch.zeros_like(x)"}
    assert (found.held, slow.after, fast.after, found.result) == ({}, None, None, "slow")  # `return slow`
    assert (slow.runs(CONFIG), fast.runs(CONFIG), found.attention_steps(CONFIG)) == (2, 8, 10)


# The same lab with a learned start for the fast state registered as a buffer, towers that end with a norm of their
# own, and a forward returning a tuple whose first item is the fast state.
LAB_HELD = (LAB_TOWERS
            .replace("        self.inner = config.fast_steps\n",
                     "        self.inner = config.fast_steps\n"
                     "        self.register_buffer(\"fast0\", torch.zeros(config.hidden_size))\n")
            .replace("        fast = torch.zeros_like(x)\n", "        fast = self.fast0.expand(x.shape).to(x.dtype)\n")
            .replace("        return slow\n", "        return fast, slow\n")
            .replace("        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.blocks_per_tower)])\n",
                     "        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.blocks_per_tower)])\n"
                     "        self.out_norm = LabRMSNorm(config.hidden_size)\n")
            .replace("            x = block(x)\n        return x\n", "            x = block(x)\n        return self.out_norm(x)\n"))


def test_a_lab_state_started_from_a_buffer_towers_with_a_norm_and_a_tuple_returned():
    assert LAB_HELD.count("fast0") == 2 and "return self.out_norm(x)" in LAB_HELD and "return fast, slow" in LAB_HELD
    found = recurrence.read({"modeling_lab.py": LAB_HELD})
    slow, fast = found.calls
    assert found.initial["fast"] == "self.fast0"  # the .expand(...).to(...) chain taken off
    assert found.held == {"fast": ("fast0", "buffer", LAB_HELD[:LAB_HELD.index("register_buffer")].count("\n") + 1)}
    assert slow.after == fast.after and slow.after[:2] == ("out_norm", "LabRMSNorm")
    assert found.result == "fast"
    # A norm holding a scale after each tower's layers: the port's stacks end with a norm without parameters.
    assert recurrence.plan(found, {"modeling_lab.py": LAB_HELD}) == (
        "LabRMSNorm out_norm after the stack's layers, not a norm without parameters")
    message = forms.repeated_stack({"modeling_lab.py": LAB_HELD}, CONFIG)
    assert message.endswith("; the port's cycles do not compute LabRMSNorm out_norm after the stack's layers, not a "
                            "norm without parameters")


def test_a_stack_called_once_or_a_model_without_stacks_reads_nothing():
    once = LAB_TOWERS.replace("                while i < self.inner:\n                    fast = self.fast(",
                              "                if i < self.inner:\n                    fast = self.fast(")
    once = once.replace("        for r in range(rounds):\n            slow = self.slow(slow + fast)\n",
                        "        if rounds:\n            slow = self.slow(slow + fast)\n")
    assert recurrence.read({"modeling_lab.py": once}) is None
    assert recurrence.read(transformers_code("llama")) is None


def test_the_plan_the_port_computes():
    # HRM: an L stack run L_cycles times, then an H stack, each on the sum of both states; L starts from the stored
    # z_L_init, H from the embeddings; each stack ends with its parameterless final_norm; H's state returned.
    hrm = recurrence.plan(recurrence.read(transformers_code("hrm_text")), transformers_code("hrm_text"))
    assert hrm == recurrence.Plan(
        stacks=("L_module", "H_module"), layers="layers", layer_class="HrmTextDecoderLayer",
        length=("num_layers_per_stack", "modeling_hrm_text.py", 279), outer="H_cycles", inner=("L_cycles", ""),
        inputs=("L_module+H_module", "H_module+L_module"), start=("z_L_init", "embeddings"), result="H_module",
        norm="final_norm", evidence="modeling_hrm_text.py:489")
    assert hrm.describe() == ("config.H_cycles cycles of L_module(L_module + H_module) config.L_cycles times, then "
                              "H_module(H_module + L_module)")
    # The lab: the slow tower first, once per round, the fast one fast_steps times on three terms (the embedding x
    # among them); fast starts from zeros, slow from the embedding; the towers end with their last block.
    lab = recurrence.plan(recurrence.read({"modeling_lab.py": LAB_TOWERS}), {"modeling_lab.py": LAB_TOWERS})
    assert (lab.stacks, lab.layers, lab.length[0], lab.outer, lab.inner) == (
        ("slow", "fast"), "blocks", "blocks_per_tower", "rounds", ("", "fast_steps"))
    assert (lab.inputs, lab.start, lab.result, lab.norm) == (
        ("slow+fast", "fast+slow+embeddings"), ("embeddings", "zeros"), "slow", "")


def test_forms_leave_the_plan_to_the_port_and_refuse_what_it_does_not_compute():
    assert forms.repeated_stack(transformers_code("hrm_text"), {"H_cycles": 2, "L_cycles": 3}) is None
    assert forms.repeated_stack({"modeling_lab.py": LAB_TOWERS}, CONFIG) is None
    # A stack called at two places of a cycle: no one state per stack.
    twice = LAB_TOWERS.replace("            slow = self.slow(slow + fast)\n",
                               "            slow = self.slow(slow + fast)\n            fast = self.slow(fast)\n")
    found = forms.repeated_stack({"modeling_lab.py": twice}, CONFIG)
    assert found.startswith("a layer stack run more than once per forward: TwoSpeedModel.forward runs config.rounds "
                            "cycles of self.slow (Tower, on slow + fast), then self.slow (Tower, on fast), then "
                            "self.fast (Tower, on fast + slow + x) config.fast_steps times (modeling_lab.py:")
    assert found.endswith(", 36 attention calls with the weights of 6 layers in 2 lists; the port's cycles do not "
                          "compute a stack called at more than one place of a cycle, or two calls assigning one "
                          "state")
    # An input term the forward computes otherwise (a product): neither a state nor the embeddings.
    scaled = LAB_TOWERS.replace("self.fast(fast + slow.to(x.dtype) + x)", "self.fast(fast + slow * 0.5)")
    assert forms.repeated_stack({"modeling_lab.py": scaled}, CONFIG).endswith(
        "the port's cycles do not compute self.fast's input term `slow * 0.5`, neither a stack's state nor the "
        "embeddings")


# A checkpoint laid out as transformers saves HRM-Text: two stacks of 2 layers, the attention's [gate | q | k | v] rows
# in one tensor, gate and up in another, the first L state stored; config.json's num_hidden_layers counts the cache
# slots (2 layers x 2 cycles x (3 + 1) stack calls), num_layers_per_stack the layers of a stack.
HRM_CONFIG = {
    "architectures": ["LabHrmTextForCausalLM"], "model_type": "hrm_text", "hidden_size": 64, "intermediate_size": 96,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 16,
    "num_layers_per_stack": 2, "H_cycles": 2, "L_cycles": 3, "L_bp_cycles": [2], "embedding_scale": 50.0,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "vocab_size": 128, "max_position_embeddings": 256,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "hidden_act": "silu", "attention_bias": False,
    "mlp_bias": False, "tie_word_embeddings": False, "prefix_lm": True, "torch_dtype": "float32",
}


def hrm_tensors(drop: str = "") -> dict[str, list[int]]:
    tensors = {"model.embed_tokens.weight": [128, 64], "lm_head.weight": [128, 64], "model.z_L_init": [64]}
    for stack in ("L_module", "H_module"):
        for i in range(2):
            layer = f"model.{stack}.layers.{i}."
            tensors.update({layer + "attn.gqkv_proj.weight": [256, 64], layer + "attn.o_proj.weight": [64, 64],
                            layer + "mlp.gate_up_proj.weight": [192, 64], layer + "mlp.down_proj.weight": [64, 96]})
    tensors.pop(drop, None)
    return tensors


def test_the_detectors_read_the_first_stack_and_the_port_loads_what_is_stored(tmp_path):
    from ckpt_factory import Shape, write_checkpoint

    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import detect
    from scaffold.mapping import weight_table

    ckpt = read_checkpoint(write_checkpoint(tmp_path, Shape(), tensors=hrm_tensors(), config=HRM_CONFIG))
    spec = detect(ckpt)
    assert (spec.recurrent_stacks, spec.recurrent_layers, spec.recurrent_norm) == (
        ["L_module", "H_module"], "layers", "final_norm")
    assert (spec.cycle_outer, spec.cycle_inner, spec.cycle_inputs, spec.cycle_start, spec.cycle_result) == (
        "H_cycles", ["L_cycles", ""], ["L_module+H_module", "H_module+L_module"], ["z_L_init", "embeddings"],
        "H_module")
    # Each stack's list is config.num_layers_per_stack long (num_hidden_layers counts the attention calls).
    assert (spec.num_layers, spec.source("num_layers").expr) == (2, "config.num_layers_per_stack")
    # The code's k_proj is num_attention_heads wide (its attention repeats no KV head), whatever
    # num_key_value_heads says; the gate is one value per output element, sigmoid.
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (4, 4, 16)
    assert (spec.attn_output_gate, spec.attn_gate_act, spec.gated_qkv) == ("elementwise", "sigmoid", "gqkv_proj")
    assert spec.names["self_attn"] == "attn" and spec.names["attn_gate"] == "gate_proj"  # as stored
    assert (spec.gate_up_layout, spec.gate_up_order, spec.names["gate_up_proj"]) == ("fused", "gate_first",
                                                                                     "gate_up_proj")
    assert "norm" not in spec.names and spec.norm_weightless  # no final norm of the model's; the stacks' own
    assert (spec.embedding_multiplier, spec.source("embedding_multiplier").expr) == (50.0, "config.embedding_scale")
    rows, homeless = weight_table(spec, ckpt)
    assert homeless == []
    cut = [(r.param, r.shard, r.note) for r in rows if r.checkpoint == "model.H_module.layers.1.attn.gqkv_proj.weight"]
    assert cut == [("model.H_module.layers.1.attn.gate_proj.weight", None, "rows 0:64 (the output gate)"),
                   ("model.H_module.layers.1.attn.qkv_proj.weight", "q", "rows 64:128"),
                   ("model.H_module.layers.1.attn.qkv_proj.weight", "k", "rows 128:192"),
                   ("model.H_module.layers.1.attn.qkv_proj.weight", "v", "rows 192:256")]
    assert [(r.param, r.shard) for r in rows if r.checkpoint == "model.z_L_init"] == [("model.z_L_init", None)]


def test_stacks_that_differ_or_a_first_state_not_stored_are_refused(tmp_path):
    from ckpt_factory import Shape, write_checkpoint

    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import detect
    from scaffold.errors import UnsupportedArchitecture

    for drop, said in (("model.H_module.layers.1.mlp.down_proj.weight",
                        "stacks that differ: model.L_module.layers.1.mlp.down_proj.weight (shape [64, 96]) has no counterpart of its shape in H_module"),
                       ("model.z_L_init", "a first state z_L_init the checkpoint does not store")):
        root = tmp_path / drop
        ckpt = read_checkpoint(write_checkpoint(root, Shape(), tensors=hrm_tensors(drop), config=HRM_CONFIG))
        try:
            detect(ckpt)
        except UnsupportedArchitecture as exc:
            assert said in str(exc), str(exc)
        else:
            raise AssertionError(f"without {drop} the port was detected")


def test_a_spec_file_cycles_must_name_the_stacks_consistently(tmp_path):
    from ckpt_factory import Shape, write_checkpoint

    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import detect
    from scaffold.errors import SpecError
    from scaffold.spec import validate_identifiers

    spec = detect(read_checkpoint(write_checkpoint(tmp_path, Shape(), tensors=hrm_tensors(), config=HRM_CONFIG)))
    validate_identifiers(spec, "spec.toml", free=False)
    for field, value, said in (("cycle_inner", ["L_cycles"], "holds 1 values, one per stack"),
                               ("cycle_inputs", ["L_module+X_module", "H_module"], "'+'-joined stacks"),
                               ("cycle_result", "X_module", "need cycle_result"),
                               ("cycle_start", ["z L", "embeddings"], "not a valid Python identifier")):
        changed = type(spec)(**{**spec.__dict__, field: value})
        try:
            validate_identifiers(changed, "spec.toml", free=False)
        except SpecError as exc:
            assert said in str(exc), str(exc)
        else:
            raise AssertionError(f"{field} = {value!r} was accepted")


def test_the_port_of_stacks_run_in_cycles_tells_its_user_pipeline_stages_are_refused(tmp_path):
    """No split of layers run in cycles into consecutive pipeline stages computes the model: the port declares no
    SupportsPP (vLLM refuses PP > 1 when the engine starts, with its own generic line), and `scaffold new`, the
    package's README and REVIEW.md say why; a port of consecutive layers (Llama's) declares SupportsPP and its README
    says nothing of it."""
    from ckpt_factory import Shape, write_checkpoint
    from click.testing import CliRunner

    from scaffold.analysis import complete
    from scaffold.checkpoint import read_checkpoint
    from scaffold.cli import main
    from scaffold.detect import detect
    from scaffold.render import render
    from scaffold.review import review_markdown

    ckpt = read_checkpoint(write_checkpoint(tmp_path / "hrm", Shape(), tensors=hrm_tensors(), config=HRM_CONFIG))
    spec = detect(ckpt)
    files = render(spec, ckpt).files
    model = next(text for name, text in files.items() if name.endswith("model.py"))
    bases = re.search(r"\nclass \w+ForCausalLM\((.*?)\):", model, flags=re.DOTALL)
    assert bases and "SupportsPP" not in bases.group(1), bases
    readme = " ".join(files["README.md"].split())
    assert ("Pipeline parallelism is not supported: the model runs its layer stacks in cycles, every cycle through "
            "every stack") in readme, readme
    assert "refuses `--pipeline-parallel-size` above 1 when the engine starts" in readme, readme
    review = review_markdown(complete(ckpt, spec))
    assert "No pipeline parallelism: every cycle runs every stack" in review
    said = CliRunner().invoke(main, ["new", str(ckpt.path), "-o", str(tmp_path / "port")])
    assert said.exit_code == 0 and "note: no pipeline parallelism: the layer stacks run in cycles" in said.output, \
        said.output
    llama = read_checkpoint(write_checkpoint(tmp_path / "llama", Shape()))
    plain = render(detect(llama), llama).files
    assert "SupportsPP" in next(text for name, text in plain.items() if name.endswith("model.py"))
    assert "pipeline" not in plain["README.md"].lower()
