"""Hash routing read from what the code computes (scaffold.detect.hashrouting): the experts of each token are its
row of an integer table indexed by its token id, weighted by the router's scores there. DeepSeek-V4's file, the
lab checkpoint's module (tests/hash_routing_ckpt.py) and a lab module written otherwise below; the forms around it
(the reader's integer table, the keys and values a module appends to the attention's)."""

from __future__ import annotations

from hash_routing_ckpt import modeling_source
from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import forms, hashrouting

DSV4_CONFIG = {"scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "n_routed_experts": 8,
               "num_experts_per_tok": 2, "hidden_size": 64, "vocab_size": 100, "num_hidden_layers": 4,
               "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"]}


def _lookup(sources, table):
    return next(found for found in hashrouting.lookups(sources) if found.table == table)


def test_deepseek_v4s_hash_router_is_read_from_the_code():
    sources = transformers_code("deepseek_v4")
    lookup = _lookup(sources, "tid2eid")
    assert (lookup.cls.name, lookup.ids) == ("DeepseekV4HashRouter", "input_ids")
    read = hashrouting.read(sources, DSV4_CONFIG, lookup, 8, 2)
    assert (read.scoring, read.renormalize, read.renormalize_key, read.scale, read.scale_key) == \
        ("sqrtsoftplus", True, None, 1.5, "routed_scaling_factor")
    assert "sqrtsoftplus (config.scoring_func) of logits gathered at tid2eid[input_ids], renormalized" in read.evidence
    # The ids are the model's input_ids, handed through the MoE block and the decoder layer.
    assert hashrouting.ids_from_model(sources, lookup) is None
    # The layers: where the block builds the hash router, on config.json.
    assert hashrouting.layer_condition(sources, DSV4_CONFIG, "layers", "DeepseekV4HashRouter", 4) == \
        ("config.mlp_layer_types[layer_idx] == 'hash_moe'", [0, 1])
    # Another scoring function config.json names is read as that one.
    read = hashrouting.read(sources, {**DSV4_CONFIG, "scoring_func": "sigmoid"}, lookup, 8, 2)
    assert read.scoring == "sigmoid"


def test_the_lab_checkpoints_gate_is_read_with_its_config_flag():
    sources = {"modeling_hashmoe.py": modeling_source()}
    config = {"norm_topk_prob": True, "num_experts": 4, "num_experts_per_tok": 2, "hidden_size": 128,
              "vocab_size": 256, "hashed_layers": 1, "num_hidden_layers": 3, "mlp_only_layers": []}
    lookup = _lookup(sources, "expert_table")
    read = hashrouting.read(sources, config, lookup, 4, 2)
    # A softmax renormalized under `if self.renorm:`, which config.norm_topk_prob sets: the port reads it at run time.
    assert (read.scoring, read.renormalize, read.renormalize_key, read.scale_key) == \
        ("softmax", True, "norm_topk_prob", None)
    off = hashrouting.read(sources, {**config, "norm_topk_prob": False}, lookup, 4, 2)
    assert (off.renormalize, off.renormalize_key) == (False, "norm_topk_prob")
    assert hashrouting.ids_from_model(sources, lookup) is None
    assert hashrouting.layer_condition(sources, config, "layers", "LabTokenHashGate", 3) == \
        ("layer_idx < config.hashed_layers", [0])


# A lab's hash routing written otherwise: the table a Parameter of int32, the ids `tok_ids`, a sigmoid of a linear
# module's output gathered along the last dim, no renormalization, a gain from the config; weights returned first;
# the layers chosen by membership in a config list, in the layer (not the block), handed down as a flag.
LAB_HASH = LAB_PRELUDE + '''class TokenLaneRouter(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, config.n_experts, bias=False)
        self.lanes_of = nn.Parameter(torch.zeros(config.vocab_size, config.top_k, dtype=torch.int32),
                                     requires_grad=False)
        self.gain = config.router_gain

    def forward(self, x, tok_ids):
        logits = self.proj(x)
        scores = torch.sigmoid(logits)
        picks = self.lanes_of[tok_ids]
        w = scores.gather(-1, picks.long())
        return w * self.gain, picks.long()


class ScoreRouter(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, config.n_experts, bias=False)
        self.k = config.top_k

    def forward(self, x):
        w, i = torch.topk(self.proj(x).softmax(-1), self.k)
        return w, i


class LabMoE(nn.Module):
    def __init__(self, config, by_token):
        super().__init__()
        self.by_token = by_token
        self.router = TokenLaneRouter(config) if by_token else ScoreRouter(config)
        self.experts = nn.ModuleList([nn.Linear(config.hidden_size, config.hidden_size) for _ in range(config.n_experts)])

    def forward(self, h, tok_ids=None):
        if self.by_token:
            w, i = self.router(h, tok_ids)
        else:
            w, i = self.router(h)
        return sum(w[..., j:j + 1] * torch.stack([e(h) for e in self.experts], -2).gather(
            -2, i[..., j, None, None].expand(*h.shape[:-1], 1, h.shape[-1])).squeeze(-2) for j in range(i.shape[-1]))


class LabBlock(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.norm = LabRMSNorm(config.hidden_size)
        self.moe = LabMoE(config, layer_idx in config.token_routed_layers)

    def forward(self, h, mask, tok_ids=None):
        return h + self.moe(self.norm(h), tok_ids)


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.num_hidden_layers)])

    def forward(self, input_ids, mask=None):
        h = self.embed(input_ids)
        for blk in self.blocks:
            h = blk(h, mask, tok_ids=input_ids)
        return h
'''
LAB_CONFIG = {"hidden_size": 64, "n_experts": 6, "top_k": 2, "vocab_size": 50, "router_gain": 2.5,
              "num_hidden_layers": 4, "token_routed_layers": [0, 2]}


def test_a_lab_hash_routing_written_otherwise_is_read():
    sources = {"modeling_lab.py": LAB_HASH}
    lookup = _lookup(sources, "lanes_of")
    assert (lookup.cls.name, lookup.ids) == ("TokenLaneRouter", "tok_ids")
    read = hashrouting.read(sources, LAB_CONFIG, lookup, 6, 2)
    assert (read.scoring, read.renormalize, read.scale, read.scale_key) == ("sigmoid", False, 2.5, "router_gain")
    assert hashrouting.ids_from_model(sources, lookup) is None
    assert hashrouting.layer_condition(sources, LAB_CONFIG, "blocks", "TokenLaneRouter", 4) == \
        ("layer_idx in config.token_routed_layers", [0, 2])


def test_a_softmax_of_the_gathered_logits_is_the_renormalized_softmax():
    """Computed otherwise, the same numbers: a softmax over the table's experts' logits is the softmax over every
    expert, gathered there and renormalized."""
    code = LAB_HASH.replace("        scores = torch.sigmoid(logits)\n", "").replace(
        "        w = scores.gather(-1, picks.long())\n", "        w = logits.gather(-1, picks.long()).softmax(-1)\n")
    sources = {"modeling_lab.py": code}
    read = hashrouting.read(sources, LAB_CONFIG, _lookup(sources, "lanes_of"), 6, 2)
    assert (read.scoring, read.renormalize, read.scale_key) == ("softmax", True, "router_gain")


def test_other_weights_and_other_ids_are_refused_by_line():
    squared = LAB_HASH.replace("return w * self.gain, picks.long()", "return w * w, picks.long()")
    sources = {"modeling_lab.py": squared}
    found = hashrouting.read(sources, LAB_CONFIG, _lookup(sources, "lanes_of"), 6, 2)
    assert isinstance(found, str) and "are not a softmax, sigmoid or sqrt-softplus of it gathered" in found
    assert found.startswith("modeling_lab.py:")
    # Experts other than the table's row (shifted by one): not hash routing as the port computes it.
    shifted = LAB_HASH.replace("picks = self.lanes_of[tok_ids]", "picks = (self.lanes_of[tok_ids] + 1) % 6")
    sources = {"modeling_lab.py": shifted}
    found = hashrouting.read(sources, LAB_CONFIG, _lookup(sources, "lanes_of"), 6, 2)
    assert "not the table's row of each token" in found
    # Ids the model computes from its input_ids before handing them down are not followed.
    other = LAB_HASH.replace("h = blk(h, mask, tok_ids=input_ids)", "h = blk(h, mask, tok_ids=input_ids % 7)")
    sources = {"modeling_lab.py": other}
    why = hashrouting.ids_from_model(sources, _lookup(sources, "lanes_of"))
    assert why.startswith("the ids TokenLaneRouter indexes lanes_of by (tok_ids) are followed through "
                          "TokenLaneRouter <- LabMoE <- LabBlock and no further")


def test_the_reader_keeps_refusing_a_table_the_port_does_not_compute():
    """forms.read_checkpoint reads the table as integers only where the routing is read; else the refusal names
    the table and why."""
    sources = {"modeling_lab.py": LAB_HASH.replace("return w * self.gain, picks.long()", "return w * w, picks.long()")}
    why = forms.hash_table_problem(sources, LAB_CONFIG, "model.blocks.0.moe.router.lanes_of", "I32")
    assert why and "are not a softmax, sigmoid or sqrt-softplus" in why
    assert forms.hash_table_problem({"modeling_lab.py": LAB_HASH}, LAB_CONFIG, "model.blocks.0.moe.router.lanes_of",
                                    "I32") is None
    # A table no class indexes by token ids: not hash routing.
    assert forms.hash_table_problem({"modeling_lab.py": LAB_HASH}, LAB_CONFIG, "model.blocks.0.moe.router.other",
                                    "I32") == ""


def test_deepseek_v4s_compressed_keys_are_named():
    found = forms.appended_keys(transformers_code("deepseek_v4"), {})
    assert found.startswith("keys and values from a module of the attention: DeepseekV4Attention.forward appends what "
                            "self.compressor returns (compressed_kv) to kv, the keys and values it attends over "
                            "(modeling_deepseek_v4.py:")
    assert "kv = torch.cat([kv, compressed_kv], dim=2)" in found
    assert "COMPRESSOR_CLASSES[self.layer_type](config) if self.layer_type != 'sliding_attention' else None" in found


LAB_MEMORY = LAB_PRELUDE + '''class LabMemoryAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.summary = LabSummary(config)

    def forward(self, x, mask):
        q, k, v = self.qkv(x).chunk(3, -1)
        extra_k, extra_v = self.summary(x, mask)
        keys = torch.cat((k, extra_k), 1)
        values = torch.cat((v, extra_v), 1)
        return F.scaled_dot_product_attention(q, keys, values)


class LabSummary(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.pool = nn.Linear(config.hidden_size, 2 * config.hidden_size)

    def forward(self, x, mask):
        return self.pool(x[:, ::4]).chunk(2, -1)
'''


def test_a_lab_attention_over_a_modules_entries_is_named():
    found = forms.appended_keys({"modeling_lab.py": LAB_MEMORY}, {})
    assert found.startswith("keys and values from a module of the attention: LabMemoryAttention.forward appends what "
                            "self.summary returns (extra_k) to k")
    # Keys a norm of the attention computes from projected keys (not from its input) are not such entries.
    normed = LAB_MEMORY.replace("extra_k, extra_v = self.summary(x, mask)", "extra_k, extra_v = self.summary(k, v)")
    assert forms.appended_keys({"modeling_lab.py": normed}, {}) is None


def test_the_scoring_router_beside_a_hash_router_is_the_routing_path():
    """The block builds the hash router in some layers and the scoring one in the others: routing.routing reads the
    scoring router's forward, whichever the code assigns last (an if/else either way round, a conditional
    expression), with the hash routers (hashrouting.lookups) skipped."""
    from scaffold.detect import routing

    lab = modeling_source()
    reversed_ = lab.replace('''        if self.hashed:
            self.gate = LabTokenHashGate(config)
        else:
            self.gate = Qwen3MoeTopKRouter(config)''', '''        if not self.hashed:
            self.gate = Qwen3MoeTopKRouter(config)
        else:
            self.gate = LabTokenHashGate(config)''')
    assert reversed_ != lab
    for code in (lab, reversed_):
        sources = {"modeling_hashmoe.py": code}
        skip = frozenset(found.cls.name for found in hashrouting.lookups(sources))
        path = routing.routing(sources, "experts", skip=skip)
        assert path.standard and path.scoring == "softmax", path
        # Without the skip, the hash router read last is taken for the router: no top-k.
        if code is reversed_:
            assert not routing.routing(sources, "experts").standard
    # DeepSeek-V4's scoring router (a conditional expression builds one or the other): sqrt-softplus scores, which the
    # port's FusedMoE does not compute: named, not passed.
    sources = transformers_code("deepseek_v4")
    path = routing.routing(sources, "experts", skip=frozenset({"DeepseekV4HashRouter"}))
    assert "topk" in path.calls and path.scoring is None
    assert "scores the experts with neither a softmax nor a sigmoid" in path.problem(2)
