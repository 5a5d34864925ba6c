"""A task from another package, found through its entry point as pip would
install it (a module and its .dist-info on the path), in real processes."""

import json
import os
import subprocess
import sys
import textwrap

PLUGIN = textwrap.dedent("""
    from dataclasses import dataclass

    from echo_learner.tasks.base import TaskPrompt, parse_options


    @dataclass
    class Countdown:
        name: str
        start: int
        system_prompt: str = ""
        max_new_tokens: int = 40

        def sample(self, rng):
            n = rng.randrange(self.start, self.start + 10)
            return TaskPrompt(f"count down from {n}:", " ".join(str(i) for i in range(n, 0, -1)))

        def heldout(self, n):
            return []

        def reward(self, prompt, completion):
            return float(completion.strip() == prompt.answer)


    def make(arg):
        return Countdown(name="countdown:" + arg, start=parse_options(arg).get("start", 3))
""")


def install_plugin(site):
    (site / "echo_countdown.py").write_text(PLUGIN)
    info = site / "echo_countdown-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-countdown\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[echo_swarm.tasks]\ncountdown = echo_countdown:make\n")


def learner(*args, site):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "echo_learner", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_a_task_registered_by_another_package_is_found_and_used(tmp_path):
    install_plugin(tmp_path)
    listed = learner("tasks", "--json", site=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["families"]["countdown"] == "echo_countdown:make"
    shown = learner("tasks", "countdown:start=20", "-n", "2", "--json", site=tmp_path)
    assert shown.returncode == 0, shown.stderr
    prompts = json.loads(shown.stdout)["prompts"]
    assert len(prompts) == 2 and all(p["text"].startswith("count down from 2") for p in prompts)
    assert prompts[0]["answer"].endswith("3 2 1")


def test_an_unknown_task_is_refused_before_anything_is_written(tmp_path):
    install_plugin(tmp_path)
    data = tmp_path / "data"
    out = learner("run", "--task", "countdwn", "--data-dir", str(data), site=tmp_path)
    assert out.returncode == 2
    assert "no task family 'countdwn'" in out.stderr and "countdown" in out.stderr
    assert not data.exists()
