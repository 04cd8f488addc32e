"""torchrun_console: torch's tailer may hand over half a line; the console gets whole lines."""

from __future__ import annotations

import io

from mpslaunch.run.torchrun.console import RankLines


def feed(*writes: str) -> tuple[str, RankLines]:
    target = io.StringIO()
    lines = RankLines(target)
    for text in writes:
        lines.write(text)
    return target.getvalue(), lines


def test_pieces_of_one_line_get_one_prefix():
    out, _ = feed("[rank0] STATE", "[rank0]  2", "[rank0]  0 gloo\n")
    assert out == "[rank0] STATE 2 0 gloo\n"


def test_ranks_interleaving_their_pieces_stay_apart():
    out, _ = feed("[rank0] a", "[rank1] x", "[rank1] y\n", "[rank0] b\n")
    assert out == "[rank1] xy\n[rank0] ab\n"


def test_several_lines_in_one_piece_each_get_a_prefix():
    out, _ = feed("[rank3] one\ntwo\nthr", "[rank3] ee\n")
    assert out == "[rank3] one\n[rank3] two\n[rank3] three\n"


def test_progress_bar_updates_end_at_carriage_returns():
    out, _ = feed("[rank0] \r 10%", "[rank0] \r 20%", "[rank0] \r100%\n")
    assert out == "[rank0]  10%\r[rank0]  20%\r[rank0] 100%\n"


def test_text_without_a_rank_prefix_passes_through():
    out, _ = feed("mpslaunch: something\n", "[default0]:torch's own prefix\n")
    assert out == "mpslaunch: something\n[default0]:torch's own prefix\n"


def test_an_unfinished_line_is_written_when_the_run_ends():
    out, lines = feed("[rank1] no newline at the end")
    assert out == ""
    lines.finish()
    assert lines.target.getvalue() == "[rank1] no newline at the end\n"
