import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import TreeError
from trtllm_medusa_ports.trees.tree import (
    MedusaTree,
    load_presets,
    pack_mask,
    parse_choices,
    unpack_mask,
    upstream_quirks,
    validate_choices,
)

SMALL = [[0], [1], [0, 0], [0, 1], [1, 0]]


def test_small_tree_buffers_match_hand_computation():
    # Derived by hand from tensorrt_llm/runtime/medusa_utils.py for these choices.
    t = MedusaTree.from_spec(SMALL)
    assert t.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert t.num_nodes == 5 and t.depth == 2
    assert t.position_offsets == [0, 1, 1, 2, 2, 2]
    assert t.medusa_topks == [2, 2]
    assert t.candidate_indices == [0, 1, 2, 3, 4, 3]
    assert t.retrieve_paths() == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]
    assert t.retrieve_paths(4) == [[0, 1, 3, -1], [0, 1, 4, -1], [0, 2, 5, -1]]
    # row i: bits of itself, its ancestors and the root (token 0)
    assert t.packed_mask == [[0b1], [0b11], [0b101], [0b1011], [0b10011], [0b100101]]
    assert t.parents == [-1, 0, 0, 1, 1, 2]


def test_input_order_does_not_matter():
    a = MedusaTree.from_spec(SMALL)
    b = MedusaTree.from_spec(list(reversed(SMALL)))
    assert a.to_dict() == b.to_dict()


def test_mc_sim_7b_63_buffers():
    t = MedusaTree.from_spec("mc_sim_7b_63")
    assert t.num_nodes == 63 and t.depth == 4
    assert len(t.packed_mask) == 64 and all(len(r) == 2 for r in t.packed_mask)
    paths = t.retrieve_paths(5)
    assert len(paths) == 42 and all(len(r) == 5 for r in paths)
    # rows follow the leaves in lexicographic order of their paths
    leaves = [t.paths[max(row) - 1] for row in paths]
    assert leaves == sorted(leaves)
    # every node's mask row decodes to exactly its ancestor chain
    m = unpack_mask(t.packed_mask, 64)
    for i in range(64):
        chain, j = set(), i
        while j >= 0:
            chain.add(j)
            j = t.parents[j]
        assert set(torch.nonzero(m[i]).flatten().tolist()) == chain
    # position offsets are depths; candidate indices address [root] + topk per head
    assert t.position_offsets[1:] == [len(p) for p in t.paths]
    assert max(t.candidate_indices) < 1 + sum(t.medusa_topks)
    # the deepest leaf of mc_sim_7b_63 sets bit 31 of word 0 only if token 31 is an ancestor
    words = t.packed_mask
    assert all(-(2**31) <= w < 2**31 for row in words for w in row)


def test_packed_mask_twos_complement_and_width():
    mask = torch.zeros(1, 40, dtype=torch.bool)
    mask[0, 31] = True
    mask[0, 0] = True
    mask[0, 33] = True
    assert pack_mask(mask) == [[-(2**31) + 1, 2]]
    assert torch.equal(unpack_mask(pack_mask(mask), 40), mask)
    t = MedusaTree.from_spec(SMALL)
    # padded to the engine's width: ceil((max_draft_len + 1) / 32) words
    assert [len(r) for r in t.packed_mask_words(max_draft_len=63)] == [2] * 6


def test_presets_are_valid_63_node_trees():
    presets = load_presets()
    assert "mc_sim_7b_63" in presets and len(presets) >= 6
    for name, paths in presets.items():
        assert validate_choices(paths) == [], name
        assert len(paths) == 63, name


@pytest.mark.parametrize(
    "paths, fragment",
    [
        ([[0], [0, 0], [0, 0]], "appears more than once"),
        ([[0], [1, 0]], "prefix [1] is not in the tree"),
        ([[0], [10]], "outside the top-10 range"),
        ([[0], [-1]], "outside the top-10 range"),
        ([], "empty"),
    ],
)
def test_validation_names_the_offending_path(paths, fragment):
    problems = validate_choices(paths)
    assert any(fragment in p for p in problems), problems
    if paths:
        with pytest.raises(TreeError, match="invalid medusa_choices"):
            MedusaTree.from_spec(paths)


def test_depth_and_draft_len_limits():
    assert any("only 2 Medusa heads" in p for p in validate_choices([[0], [0, 0], [0, 0, 0]], num_heads=2))
    assert any("max_draft_len is 2" in p for p in validate_choices([[0], [1], [2]], max_draft_len=2))
    assert validate_choices([[0], [1]], num_heads=1, max_draft_len=2) == []


def test_parse_sources(tmp_path):
    assert parse_choices("[[0], [0, 1]]") == [[0], [0, 1]]
    assert parse_choices("((0,), (0, 1))") == [[0], [0, 1]]
    f = tmp_path / "tree.json"
    f.write_text("[[0],[1]]")
    assert parse_choices(f"@{f}") == [[0], [1]]
    assert parse_choices("vicuna_7b_stage2") == load_presets()["vicuna_7b_stage2"]
    for bad, msg in [("[[0], 'a']", "path #1"), ("[[0.5]]", "integers"), ("nonsense", "not a preset"),
                     ("5", "expected a list"), (f"@{tmp_path}/missing.json", "cannot read")]:
        with pytest.raises(TreeError, match=msg):
            parse_choices(bad)


def test_depth1_gap_warning():
    assert upstream_quirks([[0], [2]]) and "use_py_session" in upstream_quirks([[0], [2]])[0]
    assert upstream_quirks([[0], [1], [1, 3]]) == []


@st.composite
def trees(draw):
    nodes = {()}
    for _ in range(draw(st.integers(1, 40))):
        parent = draw(st.sampled_from(sorted(nodes)))
        if len(parent) < 5:
            nodes.add(parent + (draw(st.integers(0, 9)),))
    nodes.discard(())
    if not nodes:
        nodes.add((0,))
    return [list(p) for p in nodes]


@settings(max_examples=60, deadline=None)
@given(trees(), st.randoms(use_true_random=False))
def test_property_buffers(paths, rnd):
    shuffled = list(paths)
    rnd.shuffle(shuffled)
    t = MedusaTree.from_spec(shuffled)
    assert t.num_nodes == len(paths)
    assert t == MedusaTree.from_spec(paths)  # canonical order
    # nodes are in BFS order, each parent before its children
    assert all(p < i for i, p in enumerate(t.parents) if i)
    # mask rows round-trip through the packed int32 form
    assert torch.equal(unpack_mask(t.packed_mask, t.num_tokens), t.attention_mask)
    # each retrieve row walks a root-to-leaf chain of parents
    for row in t.retrieve_paths():
        real = [i for i in row if i >= 0]
        assert real[0] == 0
        assert all(t.parents[b] == a for a, b in zip(real, real[1:]))
    # every node is on some retrieve row
    assert {i for row in t.retrieve_paths() for i in row if i > 0} == set(range(1, t.num_tokens))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(-3, 12), min_size=0, max_size=4), max_size=8))
def test_property_validation_never_crashes(paths):
    problems = validate_choices([p for p in paths if p]) if any(paths) else validate_choices([])
    assert isinstance(problems, list)
    try:
        MedusaTree.from_spec([p for p in paths if p] or [[]])
    except TreeError as exc:
        assert "medusa_choices" in str(exc) or "path" in str(exc)


def test_tree_cli_json(capsys):
    assert main(["tree", "--choices", json.dumps(SMALL), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["num_nodes"] == 5 and d["depth"] == 2
    assert d["position_offsets"] == [0, 1, 1, 2, 2, 2]
    assert d["packed_mask"] == [[1], [3], [5], [11], [19], [37]]
    assert d["paths"] == [[0], [1], [0, 0], [0, 1], [1, 0]]


def test_tree_cli_invalid(capsys):
    assert main(["tree", "--choices", "[[0],[1,1]]"]) == 1
    assert "prefix [1] is not in the tree" in capsys.readouterr().err
    assert main(["tree", "--choices", "[[0],[0,0],[0,0,0],[0,0,0,0]]", "--num_heads", "3"]) == 1
    err = capsys.readouterr().err
    assert "only 3 Medusa heads" in err and "drop the paths deeper than the heads" in err
    assert "every prefix" not in err  # the fix names the real problem


def test_presets_prune_to_the_head_count_everywhere(capsys):
    """tree, check, convert and verify share resolve_choices: a preset deeper than the heads is
    pruned (and the command says so); the same count of nodes comes out of each."""
    import json

    from trtllm_medusa_ports.trees.tree import load_presets, resolve_choices

    full = load_presets()["mc_sim_7b_63"]
    paths, note = resolve_choices("mc_sim_7b_63", 3)
    assert paths == [p for p in full if len(p) <= 3] and len(paths) < len(full)
    assert note == f"preset mc_sim_7b_63 pruned to the depth of 3 Medusa head(s): {len(paths)} of its 63 nodes kept"
    assert resolve_choices("mc_sim_7b_63", 5) == (full, None)  # deep enough: untouched
    assert main(["tree", "--medusa_choices", "mc_sim_7b_63", "--num_medusa_heads", "3", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["num_nodes"] == len(paths) and "pruned" in out.err


def test_a_preset_named_in_a_file_is_pruned_as_the_preset_is(tmp_path):
    """@FILE holding a preset's name is that preset, pruned to the heads' depth as the name itself is (issue 57, 10)."""
    from trtllm_medusa_ports.trees.tree import resolve_choices

    f = tmp_path / "tree.txt"
    f.write_text("mc_sim_7b_63\n")
    direct, note = resolve_choices("mc_sim_7b_63", 3)
    via_file, file_note = resolve_choices(f"@{f}", 3)
    assert via_file == direct and len(direct) == 61 and file_note == note and "pruned" in note
