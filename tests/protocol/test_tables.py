"""Command-line tables: plain aligned columns when piped, a rich table in a terminal."""

from protocol.tables import print_table

ROWS = [(1, "12D3KooWlongerpeerid", 1234), (2, "short", 5)]


def test_piped_output_is_plain_aligned_columns(capsys, monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    print_table(("#", "peer", "credit"), ROWS, numeric=("#", "credit"))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines] == [
        ["#", "peer", "credit"],
        ["1", "12D3KooWlongerpeerid", "1234"],
        ["2", "short", "5"],
    ]
    assert "\x1b" not in "".join(lines) and "─" not in "".join(lines)  # no colours, no box characters
    assert len({line.index("1234") + 4 for line in lines[1:2]} | {lines[2].index("5") + 1}) == 1  # right-aligned


def test_a_terminal_gets_a_table_with_a_header_rule(capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    print_table(("#", "peer", "credit"), ROWS, numeric=("#", "credit"))
    out = capsys.readouterr().out
    assert "─" in out and "12D3KooWlongerpeerid" in out and "\x1b[1m" in out  # bold header
