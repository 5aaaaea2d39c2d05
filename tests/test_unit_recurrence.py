"""Layer stacks run in cycles (scaffold.detect.recurrence), read from what the forward computes: transformers'
HrmText (an L stack run L_cycles times, then an H stack, in H_cycles cycles) and a lab's model that names, nests and
orders its stacks otherwise (the slow stack first, a while loop bounded by an attribute copied from the config, a
config alias, a third term in one input); and the refusal forms.repeated_stack words from the reading."""

from __future__ import annotations

from dataclasses import replace

from ckpt_factory import Shape
from helpers import LAB_PRELUDE, read, transformers_code

from scaffold.checkpoint import TensorInfo
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
    message = forms.repeated_stack({"modeling_lab.py": LAB_HELD}, CONFIG)
    assert message.endswith(f"; beside the cycles a port computes self.fast's first state from the buffer self.fast0 "
                            f"(modeling_lab.py:{found.held['fast'][2]}), LabRMSNorm out_norm after the layers of "
                            f"self.slow, self.fast (modeling_lab.py:{slow.after[2]}), self.fast's state returned")


def test_a_stack_called_once_or_a_model_without_stacks_reads_nothing():
    once = LAB_TOWERS.replace("                while i < self.inner:\n                    fast = self.fast(",
                              "                if i < self.inner:\n                    fast = self.fast(")
    once = once.replace("        for r in range(rounds):\n            slow = self.slow(slow + fast)\n",
                        "        if rounds:\n            slow = self.slow(slow + fast)\n")
    assert recurrence.read({"modeling_lab.py": once}) is None
    assert recurrence.read(transformers_code("llama")) is None


def test_the_refusal_names_the_recurrence_and_what_the_port_lacks():
    config = {"H_cycles": 2, "L_cycles": 3, "num_layers_per_stack": 3}
    found = forms.repeated_stack(transformers_code("hrm_text"), config)
    assert found.startswith(
        "a layer stack run more than once per forward: HrmTextModel.forward runs config.H_cycles cycles of "
        "self.L_module (HrmTextStack, on hidden_states_low_cycle + hidden_states_high_cycle) config.L_cycles times, "
        "then self.H_module (HrmTextStack, on hidden_states_high_cycle + hidden_states_low_cycle) "
        "(modeling_hrm_text.py:")
    assert ("the port runs one list of decoder layers once, with one KV cache per layer, where this forward makes 24 "
            "attention calls with the weights of 6 layers in 2 lists, each call keeping a KV cache of its own; beside "
            "the cycles a port computes self.L_module's first state from the parameter self.z_L_init "
            "(modeling_hrm_text.py:408), HrmTextRMSNorm final_norm after the layers of self.L_module, self.H_module "
            "(modeling_hrm_text.py:302), self.H_module's state returned") in found
    lab = forms.repeated_stack({"modeling_lab.py": LAB_TOWERS}, CONFIG)
    assert "TwoSpeedModel.forward runs config.rounds cycles of self.slow (Tower, on slow + fast), then self.fast " \
           "(Tower, on fast + slow + x) config.fast_steps times (modeling_lab.py:" in lab
    assert lab.endswith("makes 30 attention calls with the weights of 6 layers in 2 lists, each call keeping a KV "
                        "cache of its own; beside the cycles a port computes self.slow's state returned")


def test_the_refusal_names_the_stacks_tensors_cut_in_more_blocks_than_the_ports_fused_parameters(tmp_path):
    # transformers' conversion table cuts HRM-Text's attn.gqkv_proj into gate, q, k, v (four row blocks) and its
    # mlp.gate_up_proj into gate, up (two: the port's own fused layout, not named).
    ckpt = read(tmp_path, Shape(model_type="hrm_text"))
    tensors = {}
    for stack in ("L_module", "H_module"):
        for i in range(2):
            for leaf, shape in (("attn.gqkv_proj.weight", (256, 64)), ("mlp.gate_up_proj.weight", (256, 64))):
                name = f"model.{stack}.layers.{i}.{leaf}"
                tensors[name] = TensorInfo(name, "F32", shape, "model.safetensors")
    ckpt = replace(ckpt, tensors=tensors)
    cycles = recurrence.read(transformers_code("hrm_text"))
    assert forms.stored_fused(ckpt, cycles) == (
        "; and the stacks' layers store attn.gqkv_proj.weight (4 tensors, e.g. model.H_module.layers.0.attn.gqkv_proj."
        "weight: [self_attn.gate_proj | self_attn.q_proj | self_attn.k_proj | self_attn.v_proj] row blocks), which "
        "transformers' conversion table cuts on load, where the port's fused attention projection holds q, k, v")
    # Stored under another module than the stacks' layer lists: not the stacks' (nothing to name).
    moved = {n.replace(".layers.", ".blocks."): replace(t, name=n.replace(".layers.", ".blocks."))
             for n, t in tensors.items()}
    assert forms.stored_fused(replace(ckpt, tensors=moved), cycles) == ""
