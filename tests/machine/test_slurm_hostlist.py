"""SLURM's compressed node lists and task counts (machine/slurm.py), on the forms SLURM writes and
scontrol reads, and against `scontrol show hostnames` itself where SLURM is installed."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from mpslaunch.machine import MAX_NODES, expand_hostlist, expand_tasks_per_node

# What scontrol show hostnames printed for each list (slurm 22.05).
SCONTROL_READS = {
    "node01": ("node01",),
    "node[01-04,07]": ("node01", "node02", "node03", "node04", "node07"),
    "host[009-011]": ("host009", "host010", "host011"),
    "gpu-a,node[01,07]": ("gpu-a", "node01", "node07"),
    "rack[1-2]-node[01-02]": ("rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"),
    "node[1-2]x[3-4]": ("node1x3", "node1x4", "node2x3", "node2x4"),
    "n[1-2][3-4]": ("n13", "n14", "n23", "n24"),
    "n[9-11]": ("n9", "n10", "n11"),
    "n[09-11]": ("n09", "n10", "n11"),
    "n[1-010]": tuple(f"n{number}" for number in range(1, 11)),
    "n[01-2,3]": ("n01", "n02", "n3"),
    "n[099-100]": ("n099", "n100"),
    "n[3,1]": ("n3", "n1"),
    "n[1-3,2]": ("n1", "n2", "n3", "n2"),
    "node1,node1": ("node1", "node1"),
    "n[0]": ("n0",),
    "n[00]": ("n00",),
    "[1-2]": ("1", "2"),
    "1[1-2]": ("11", "12"),
    "a.b[1-2]": ("a.b1", "a.b2"),
    "n-[1-2]": ("n-1", "n-2"),
    "n[99999998-100000001]": ("n99999998", "n99999999", "n100000000", "n100000001"),
}

# What scontrol cannot read (it prints nothing, "Invalid hostlist" on stderr, and exits 0), and
# what it reads in surprising ways (`n[1` as "n]", `x]y` as itself, `n[1-]` as n1): all refused.
UNREADABLE = {
    "dgx[1-2]-ib": "text after the last bracket",
    "a[1-2]b[3-4]c": "text after the last bracket",
    "n[5-3]": "reversed range",
    "n[1-3-5]": "not a number or a range",
    "n[1,,2]": "not a number or a range",
    "n[]": "not a number or a range",
    "n[a-b]": "not a number or a range",
    "n[-1]": "not a number or a range",
    "n[1-]": "not a number or a range",
    "n[+1-2]": "not a number or a range",
    "n[[1-2]]": "bracket inside a bracket",
    "n[1": "'[' without its ']'",
    "n[1,2": "'[' without its ']'",
    "n1]": "']' without its '['",
    "n[1-2]]": "']' without its '['",
    "x]y": "']' without its '['",
    "a b": "space",
    "a,,b": "empty name",
    "n[1-2],": "empty name",
    "": "empty",
    "   ": "empty",
    "n[1-65537]": "more than 65536",
    "n[1-300]m[1-300]": "90000 nodes",
    "n[0-99999999999999999999]": "more than 65536",
}


@pytest.mark.parametrize("text", SCONTROL_READS)
def test_a_node_list_expands_as_scontrol_expands_it(text):
    assert expand_hostlist(text) == SCONTROL_READS[text]


@pytest.mark.parametrize("text", UNREADABLE)
def test_what_scontrol_cannot_read_is_refused_saying_why(text):
    with pytest.raises(ValueError, match="node list") as refused:
        expand_hostlist(text)
    assert UNREADABLE[text] in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_largest_list_scontrol_reads_expands():
    names = expand_hostlist(f"n[1-{MAX_NODES}]")
    assert len(names) == MAX_NODES and names[-1] == f"n{MAX_NODES}"


# Generated lists: names of a prefix and a zero-padded number, as SLURM compresses them.
PREFIXES = st.from_regex(r"[a-z][a-z0-9.-]{0,6}[a-z-]", fullmatch=True)
NUMBERS = st.tuples(st.integers(0, 2000), st.integers(1, 4))  # (number, digits written)


def written(number: int, digits: int) -> str:
    return str(number).zfill(digits)


@st.composite
def node_names(draw) -> list[str]:
    """Names as clusters name their nodes: prefix, zero-padded number; some plain names."""
    names = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            prefix = draw(PREFIXES)
            names += [prefix + written(*number) for number in draw(st.lists(NUMBERS, min_size=1, max_size=5))]
        else:
            names.append(draw(PREFIXES))
    return names


@given(node_names())
def test_plain_names_joined_by_commas_are_themselves(names):
    assert expand_hostlist(",".join(names)) == tuple(names)


@st.composite
def bracketed(draw) -> tuple[str, tuple[str, ...]]:
    """A list written with bracket groups, ranges and single numbers, and the names it stands for
    (each range a run of consecutive numbers at the first number's width)."""
    expressions, names = [], []
    for _ in range(draw(st.integers(1, 4))):
        prefix = draw(PREFIXES)
        items, numbers = [], []
        for first, digits in draw(st.lists(NUMBERS, min_size=1, max_size=4)):
            length = draw(st.integers(1, 5))
            last = first + length - 1
            items.append(written(first, digits) if length == 1 else f"{written(first, digits)}-{last}")
            numbers += [written(number, digits) for number in range(first, last + 1)]
        expressions.append(f"{prefix}[{','.join(items)}]")
        names += [prefix + number for number in numbers]
    return ",".join(expressions), tuple(names)


@given(bracketed())
def test_bracket_ranges_stand_for_their_numbers_in_order_with_padding(case):
    text, names = case
    assert expand_hostlist(text) == names


@given(st.text(alphabet="n0123456789[]-,x ", max_size=30))
def test_any_text_expands_or_raises_value_error(text):
    try:
        names = expand_hostlist(text)
    except ValueError as error:
        assert "\n" not in str(error)
    else:
        assert names and all(name and "," not in name and "[" not in name for name in names)


@pytest.mark.parametrize("text,counts", [
    ("1", (1,)), ("1(x2)", (1, 1)), ("2(x2)", (2, 2)), ("2,1", (2, 1)), ("2(x3),1", (2, 2, 2, 1)),
    ("8(x2),4,8(x1)", (8, 8, 4, 8)), ("0", (0,)),
])
def test_tasks_per_node_expands(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2(x)", "2(3)", "(x2)", "2(x2", "2,,1", "-1", "2(x0)", "2(x99999)"])
def test_tasks_per_node_that_cannot_be_read_is_refused(text):
    with pytest.raises(ValueError, match="tasks per node"):
        expand_tasks_per_node(text)


# Against SLURM's own reading, where SLURM is installed.


@pytest.fixture(scope="module")
def scontrol_hostnames(tmp_path_factory):
    """`scontrol show hostnames TEXT`, as a tuple of names (empty where it cannot read TEXT). It
    needs a config file to start, not a running cluster."""
    if not shutil.which("scontrol"):
        pytest.skip("scontrol is not installed (tests/slurm/local_slurm.sh start installs SLURM)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=hostlists\nSlurmctldHost=localhost\n")

    def hostnames(text: str) -> tuple[str, ...]:
        shown = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True,
                               text=True, timeout=10, env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"})
        assert shown.returncode == 0, shown.stderr
        return tuple(shown.stdout.split())

    return hostnames


SLOW_ORACLE = settings(max_examples=150, deadline=None,
                       suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.parametrize("text", SCONTROL_READS)
def test_the_examples_are_what_scontrol_prints(scontrol_hostnames, text):
    assert scontrol_hostnames(text) == SCONTROL_READS[text]


@pytest.mark.slow
@pytest.mark.slurm
@SLOW_ORACLE
@given(bracketed())
def test_generated_lists_expand_as_scontrol_expands_them(scontrol_hostnames, case):
    text, _ = case
    assert expand_hostlist(text) == scontrol_hostnames(text)


@pytest.mark.slow
@pytest.mark.slurm
@SLOW_ORACLE
@given(st.text(alphabet="n01[]-,", min_size=1, max_size=16).filter(lambda text: not text.startswith("-")))
@example("dgx[1-2]-ib")
@example("n[1-2]x[3]")
def test_what_scontrol_cannot_read_is_refused_and_the_rest_agrees(scontrol_hostnames, text):
    """Where scontrol prints nothing, the list is refused; where both read it, they agree (a few
    odd forms that scontrol reads in its own way, such as `n[1`, are refused here)."""
    theirs = scontrol_hostnames(text)
    try:
        ours = expand_hostlist(text)
    except ValueError:
        return
    assert ours == theirs
