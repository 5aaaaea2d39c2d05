"""Forms of Falcon's original remote code (tiiuae's modelling_RW.py, RWForCausalLM), written here as lab modules of our
own: a linear class that shadows the name of the one it subclasses, a fused projection cut per KV group with list
indices and destructured from a list comprehension, and a config class that does not define tie_word_embeddings."""

from __future__ import annotations

import textwrap

from scaffold.detect import dataflow
from scaffold.detect.linears import linear_classes

SHADOWING_LINEAR = textwrap.dedent('''
    import torch
    from torch import nn


    class Linear(nn.Linear):
        def forward(self, input):
            ret = input @ self.weight.T
            return ret if self.bias is None else ret + self.bias
''')

GROUPED_SPLIT = SHADOWING_LINEAR + textwrap.dedent('''

    class Attention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.num_heads = config.n_head
            self.num_kv = config.n_head_kv
            self.head_dim = config.hidden_size // config.n_head
            self.query_key_value = Linear(config.hidden_size, (2 * config.n_head_kv + config.n_head) * self.head_dim)
            self.dense = Linear(config.hidden_size, config.hidden_size)

        def _split_heads(self, fused):
            b, s, _ = fused.shape
            qkv = fused.view(b, s, -1, self.num_heads // self.num_kv + 2, self.head_dim)
            q = qkv[:, :, :, :-2]
            k = torch.broadcast_to(qkv[:, :, :, [-2]], q.shape)
            v = torch.broadcast_to(qkv[:, :, :, [-1]], q.shape)
            (q, k, v) = [x.flatten(2, 3) for x in [q, k, v]]
            return (q, k, v)

        def forward(self, hidden_states):
            q, k, v = self._split_heads(self.query_key_value(hidden_states))
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.dense(out.flatten(2))
''')


def test_a_linear_class_named_as_the_one_it_subclasses_is_a_linear_layer():
    """`class Linear(nn.Linear)` multiplying by self.weight.T: before, defining a class named Linear that creates no
    weight of its own took nn.Linear out of the known linear layers, and the attention 'declared no nn.Linear'."""
    found = linear_classes({"modelling_rw.py": SHADOWING_LINEAR})
    assert "Linear" in found and not found["Linear"].transposed
    assert "subclasses Linear" in found["Linear"].where


def test_a_fused_projection_cut_per_kv_group_and_destructured_from_a_list_comprehension_is_grouped():
    """view(..., groups, heads per group + 2, head_dim); [..., :-2], [..., [-2]], [..., [-1]]; broadcast_to; then
    `(q, k, v) = [f(x) for x in [q, k, v]]`: read as qkv_layout grouped (before: no piece for the list indices, and
    nothing through the comprehension, so the tensor's shape alone said 'fused')."""
    sources = {"modelling_rw.py": GROUPED_SPLIT}
    file, cls = dataflow._class(sources, "Attention")
    found = dataflow.analyze_attention(sources, file, cls, {"n_head": 4, "n_head_kv": 2, "hidden_size": 256})
    assert (found.layout, found.q, found.k, found.v) == ("grouped", "query_key_value", "query_key_value",
                                                         "query_key_value")


def test_the_tie_is_written_into_the_port_where_config_json_does_not_hold_it(tmp_path):
    """A lab's config class may not define tie_word_embeddings (transformers 5's PretrainedConfig no longer does):
    where config.json lacks the key, the port keeps the value the tensors gave instead of reading
    config.tie_word_embeddings at run time (before: AttributeError when vLLM built the port)."""
    from scaffold.model_context import choices
    from scaffold.spec import Source, Spec

    spec = Spec()
    spec.set("register_config", True, Source("derived", "model_type 'RefinedWeb' is unknown to transformers"))
    spec.set("tie_word_embeddings", False, Source("config", "lm_head.weight present"))
    assert choices(spec, set())["literal_tie"]
    spec.set("tie_word_embeddings", False, Source("config", "config.json tie_word_embeddings"))
    assert not choices(spec, set())["literal_tie"]
    # transformers' own config class defines the attribute: read at run time, as a sibling checkpoint may set it.
    spec.set("register_config", False, Source("derived", "model_type 'gpt2' is transformers'"))
    spec.set("tie_word_embeddings", True, Source("tensor", "no lm_head.weight: the head is the embedding"))
    assert not choices(spec, set())["literal_tie"]
