"""Command-line tables: plain aligned columns when piped, a rich table in a terminal."""

from protocol.process.tables import print_fields, print_table

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


def test_fields_piped_are_one_aligned_line_each_however_long(capsys, monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    long = "forecast utilization 93%; " + "enough rollout throughput " * 10
    print_fields([("job", "reverse-abc"), ("capacity", long), ("bootstrap", "/ip4/127.0.0.1/tcp/1: answers")])
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "job        reverse-abc",
        f"capacity   {long.rstrip()}",
        "bootstrap  /ip4/127.0.0.1/tcp/1: answers",
    ]


def test_fields_in_a_terminal_have_bold_labels(capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    print_fields([("job", "reverse-abc"), ("credit", 12)])
    out = capsys.readouterr().out
    assert "\x1b[1mjob" in out and "reverse-abc" in out and "12" in out


def test_piped_rows_wider_than_80_columns_are_never_cut(capsys, monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)
    peer = "12D3KooWQ9tSfsvjKxe1EGuxG3SyVzsPtE4fXL7JmWbDvWVT2cHs"
    row = (peer, "llama.cpp", "12", "accepted 3,456 batches; last seen 2 s ago from /ip4/203.0.113.7/tcp/4001")
    print_table(("peer", "backend", "version", "note"), [row])
    lines = capsys.readouterr().out.splitlines()
    assert "…" not in "".join(lines)
    assert lines[1].split(None, 3) == list(row)
