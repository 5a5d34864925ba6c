import random

import pytest

from echo_learner.tasks.base import TaskError, TaskPrompt, parse_options
from echo_learner.tasks.registry import load_task
from echo_learner.tasks.reverse import ReverseTask


def test_reverse_prompts_and_rewards():
    task = ReverseTask()
    p = task.sample(random.Random(1))
    assert p.text.endswith("=") and p.answer == p.text[:-1][::-1]
    q = TaskPrompt("abc=", "cba")
    assert task.reward(q, "cba") == 1.0
    assert task.reward(q, "cbd") == 2 / 3
    assert task.reward(q, "cbaaaa") == 0.5  # rambling is penalised
    assert task.reward(q, "") == 0.0


def test_reverse_never_trains_on_its_heldout_split():
    task = load_task("reverse:alphabet=abc,length=2")
    heldout = {p.text for p in task.heldout(100)}
    assert heldout and len(heldout) < 9  # some of the 9 strings, not all
    rng = random.Random(0)
    drawn = {task.sample(rng).text for _ in range(500)}
    assert drawn and not drawn & heldout
    assert len(drawn | heldout) == 9  # everything else is trained on


def test_options_parse_as_json_or_text():
    assert parse_options('a=2, b=0.5,c=true,d=x y,e="q"') == {"a": 2, "b": 0.5, "c": True, "d": "x y", "e": "q"}
    assert parse_options("") == {}
    with pytest.raises(TaskError, match="key=value"):
        parse_options("novalue")


@pytest.mark.parametrize(
    "spec, error",
    [
        ("nosuchfamily", "no task family 'nosuchfamily'"),
        ("reverse:colour=red", "reverse has no option colour"),
        ("reverse:length=0", "length must be 1 to 16"),
        ("rg:no_such_dataset", "reasoning-gym has no task 'no_such_dataset'"),
        ("rg:basic_arithmetic:seed=3", "seed is set by the learner"),
        ("rg:basic_arithmetic:min_terms=5,max_terms=2", "rg:basic_arithmetic"),
        ("rg:basic_arithmetic:" + ",".join(f"min_terms={i}" for i in range(30)), "at most 256"),
    ],
)
def test_bad_specs_are_refused_with_what_is_wrong(spec, error):
    with pytest.raises(TaskError, match=error):
        load_task(spec)


def test_reasoning_gym_task_scores_with_its_own_verifier_and_the_format():
    task = load_task("rg:basic_arithmetic:min_terms=2,max_terms=2,min_digits=1,max_digits=1")
    p = task.sample(random.Random(0))
    assert "<answer>" in p.text and p.answer
    assert task.reward(p, f"thinking... <answer>{p.answer}</answer>") == pytest.approx(1.0)
    assert task.reward(p, f"<answer>{p.answer}</answer> and <answer>{p.answer}</answer>") == pytest.approx(0.9)
    assert task.reward(p, "<answer>not a number</answer>") == pytest.approx(0.1)  # format only
    assert task.reward(p, p.answer) == 0.0  # no answer block
    heldout = {q.text for q in task.heldout(200)}
    assert len(heldout) > 100
    rng = random.Random(1)
    assert not {task.sample(rng).text for _ in range(300)} & heldout


def test_math_task_accepts_equivalent_forms_of_the_answer():
    task = load_task("math:basic_arithmetic:min_terms=2,max_terms=2,min_digits=1,max_digits=1")
    p = TaskPrompt("What is 1/2?", "0.5")
    for same in ("0.5", "1/2", "\\frac{1}{2}", "$0.50$"):
        assert task.reward(p, f"<answer>{same}</answer>") == pytest.approx(1.0), same
    assert task.reward(p, "<answer>0.6</answer>") == pytest.approx(0.1)
    assert task.reward(p, "<answer>\\frac{1}{</answer>") == pytest.approx(0.1)  # unparseable: no crash
    assert task.reward(p, "Half of one is 1/2.") == pytest.approx(0.9)  # right, but not in the format
    assert task.reward(p, "No idea, maybe 3.") == 0.0
    real = task.sample(random.Random(0))
    assert task.reward(real, f"<answer>{real.answer}</answer>") == pytest.approx(1.0)


def test_a_task_spec_with_options_fits_a_signed_manifest_record():
    """The spec travels in every manifest, which the DHT's validator checks."""
    from protocol import codec, manifest
    from protocol.identity import Identity
    from protocol.net.records import decode_record

    spec = "math:basic_arithmetic:min_terms=2,max_terms=2,min_digits=1,max_digits=1"
    assert load_task(spec).name == spec
    me = Identity.generate()
    signed, _ = manifest.build(
        me,
        job_id="j",
        version=0,
        parent_version=-1,
        task=spec,
        model_config="{}",
        tokenizer_digest=bytes(32),
        weights=b"w" * 10,
        chunk_size=4,
    )
    assert decode_record(f"/echo-swarm/{me.peer_id_str}", codec.encode(signed)).task == spec
