"""torchrun_console: torch's tailer may hand over half a line; the console gets whole lines."""

from __future__ import annotations

import io

from mpslaunch.run.torchrun.console import MAX_HELD, RankLines, split_lines


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


def test_torchs_own_rank_prefix_is_not_repeated():
    # torch's excepthook writes "[rank1]: ...", its C++ warnings "[rank1]:[W...]".
    out, lines = feed("[rank1] [rank1]: Traceback (most recent call last):\n",
                      "[rank1] [rank1]:[W0101 warning]\n", "[rank1] [rank0]: another rank's\n",
                      "[rank1] [rank1]: unfinished")
    lines.finish()
    assert lines.target.getvalue() == ("[rank1] Traceback (most recent call last):\n"
                                       "[rank1] [W0101 warning]\n"
                                       "[rank1] [rank0]: another rank's\n"
                                       "[rank1] unfinished\n")


def test_lines_split_at_every_kind_of_line_end():
    assert split_lines("a\r\nb\rc\nd") == (["a\r\n", "b\r", "c\n"], "d")
    assert split_lines("") == ([], "")


def test_a_line_longer_than_the_limit_is_shown_in_pieces_and_never_held_whole():
    # A rank that writes megabytes without a newline: bounded memory, linear work.
    out, lines = feed("[rank0] " + "x" * (2 * MAX_HELD + 5), *["[rank0] " + "y" * 1000] * 70)
    assert all(len(rest) <= MAX_HELD for rest in lines.unfinished.values())
    shown = out.splitlines()
    assert shown[:2] == ["[rank0] " + "x" * MAX_HELD] * 2
    assert all(len(line) == len("[rank0] ") + MAX_HELD for line in shown)
    lines.write("[rank0] end\n")
    joined = "".join(line.removeprefix("[rank0] ") for line in lines.target.getvalue().splitlines())
    assert joined == "x" * (2 * MAX_HELD + 5) + "y" * 70_000 + "end"


class Writes:
    """A console that records the length of each write torch's tailer makes."""

    def __init__(self):
        self.sizes: list[int] = []
        self.text: list[str] = []

    def write(self, text: str) -> int:
        self.sizes.append(len(text))
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_torchs_tailer_reads_a_line_without_an_end_in_bounded_pieces(tmp_path):
    """torch's own TailLog, as the run starts it, over a rank's file of 3 MB without a newline:
    no read (and so no copy of it in the launcher) is longer than MAX_HELD."""
    from torch.distributed.elastic.multiprocessing.tail_log import TailLog

    from mpslaunch.run.torch_internals import tails_in_pieces

    log = tmp_path / "stdout.log"
    log.write_text("x" * 3_000_000)
    console = Writes()
    with tails_in_pieces(MAX_HELD):
        tailer = TailLog("rank", {0: str(log)}, console, {0: "[rank0] "}).start()
        tailer.stop()
    assert max(console.sizes) <= len("[rank0] ") + MAX_HELD
    assert "".join(piece.removeprefix("[rank0] ") for piece in console.text) == "x" * 3_000_000


class FinishesWhenAsked:
    """The end of a rank's output, as the tailer sees it: the first look at `finished` is when the
    rank writes its last line and ends, in the window between the tailer's read and its look."""

    def __init__(self, log):
        self.log, self.asked = log, False

    def is_set(self) -> bool:
        if not self.asked:
            self.asked = True
            with self.log.open("a") as stream:
                stream.write("last line\n")
        return True


def test_a_last_line_written_as_the_rank_ends_reaches_the_console(tmp_path):
    """The tailer looks at `finished` before it reads, so the line written between a read that
    found the end of the file and that look is still copied."""
    from torch.distributed.elastic.multiprocessing import tail_log

    from mpslaunch.run.torch_internals import tails_in_pieces

    log = tmp_path / "stdout.log"
    log.write_text("first line\n")
    console = Writes()
    with tails_in_pieces(MAX_HELD):
        tail_log.tail_logfile("[rank0] ", str(log), console, FinishesWhenAsked(log), 0.01)
    assert "".join(console.text) == "[rank0] first line\n[rank0] last line\n"
