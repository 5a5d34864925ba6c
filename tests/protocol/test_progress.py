"""Progress bars: drawn in a terminal (bytes, rate, time left), silent when piped."""

from protocol.process.progress import progress


def test_a_terminal_sees_bytes_and_the_fields(capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    with progress("weights v3", 8 * 2**20, in_bytes=True) as bar:
        bar(4 * 2**20, peers=5)
    err = capsys.readouterr().err
    assert "weights v3" in err and "MB" in err and "peers=5" in err


def test_nothing_is_drawn_when_piped(capsys, monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    with progress("training", 10) as bar:
        bar(3, reward="0.5")
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
