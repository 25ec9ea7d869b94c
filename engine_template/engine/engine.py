"""The offline engine: build once, then generate / score / verify batches of token-id requests."""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from .attention_backend import AttentionConfig
from .attention_registry import select_backend
from .batch import ForwardBatch
from .config import ModelConfig
from .kernels import select_ops
from .kv_cache import KVCache, PageAllocator, PageTable
from .loader import load_weights
from .model import CausalLM
from .request import Generation, Request, Score
from .sampling import SamplingParams, sample


@dataclass(frozen=True)
class DecodeStep:
    """A launched decode step: its rows, its logits and chosen tokens on the device, and those tokens on their way
    to the host. The copy is ordered right after the step, so reading it waits for this step only, not for the
    step launched after it."""
    rows: list[Request]
    logits: torch.Tensor  # a graph's output buffer, rewritten by the next step: read later only for forced rows,
    tokens: torch.Tensor  # which never run ahead
    tokens_host: torch.Tensor
    copied: torch.cuda.Event | None  # None on the CPU, where the copy is done when it returns

    def read_tokens(self) -> list[int]:
        if self.copied is not None:
            self.copied.synchronize()
        return self.tokens_host.tolist()


@dataclass(frozen=True)
class EngineOptions:
    device: str = "auto"                  # "auto" picks cuda when available
    dtype: str = "auto"                   # "auto": bfloat16 on cuda, float32 on cpu
    max_batch_size: int = 32
    max_seq_len: int | None = None        # default: min(model limit, 4096)
    page_size: int = 16
    kv_cache_tokens: int | None = None    # default: max_batch_size * max_seq_len
    max_prefill_tokens: int = 8192
    use_cuda_graphs: bool = True
    cuda_graph_batch_sizes: tuple[int, ...] | None = None  # default: 1, 2, 4, 8, then multiples of 8
    attention_backend: str = "auto"       # auto | torch | triton | flashinfer
    kernel_backend: str = "auto"          # auto | torch | triton
    seed: int = 0

    @classmethod
    def from_dict(cls, values: dict) -> "EngineOptions":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


class Engine:
    def __init__(self, model_dir: str | Path, options: EngineOptions | dict | None = None):
        if isinstance(options, dict):
            options = EngineOptions.from_dict(options)
        self.options = options or EngineOptions()
        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise ValueError(f"model dir {self.model_dir} does not exist")
        self.config = ModelConfig.from_model_dir(self.model_dir)
        self.device = _resolve_device(self.options.device)
        self.dtype = _resolve_dtype(self.options.dtype, self.device)
        self.max_seq_len = min(self.options.max_seq_len or 4096, self.config.max_position_embeddings)
        self.eos_token_ids = self.config.eos_token_ids
        self.model: CausalLM | None = None
        self.graphs = None
        self._counters = {"prefill_steps": 0, "decode_steps": 0, "graph_replays": 0, "generated_tokens": 0}
        self._build_seconds = 0.0

    # ---- build -------------------------------------------------------------------------------------------------
    def build(self) -> "Engine":
        start = time.perf_counter()
        opts, cfg = self.options, self.config
        if opts.page_size < 1 or opts.max_batch_size < 1:
            raise ValueError("page_size and max_batch_size must be positive")
        self.ops = select_ops(self.device.type, opts.kernel_backend)
        weights = load_weights(self.model_dir, cfg, self.dtype, self.device)
        self.model = CausalLM(cfg, weights, self.ops, self.max_seq_len)
        pages_per_req = math.ceil(self.max_seq_len / opts.page_size)
        kv_tokens = opts.kv_cache_tokens or opts.max_batch_size * self.max_seq_len
        num_pages = math.ceil(kv_tokens / opts.page_size) + 1  # + the reserved padding page
        self.kv = KVCache(cfg.num_layers, num_pages, opts.page_size, cfg.num_kv_heads, cfg.head_dim, self.dtype,
                          self.device)
        self.allocator = PageAllocator(num_pages)
        self.page_table = PageTable(opts.max_batch_size, pages_per_req, self.device)
        self.attn = select_backend(opts.attention_backend, AttentionConfig(
            num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, dtype=self.dtype,
            device=self.device, max_batch_size=opts.max_batch_size, page_size=opts.page_size,
            max_pages_per_request=pages_per_req))
        if opts.use_cuda_graphs and self.device.type == "cuda":
            from .cuda_graph import DecodeGraphs
            sizes = opts.cuda_graph_batch_sizes or _default_graph_sizes(opts.max_batch_size)
            sizes = [s for s in sizes if 1 <= s <= opts.max_batch_size]
            self.graphs = DecodeGraphs(self._model_forward, self.attn.plan, sizes, self.page_table.width,
                                       self.device)
        self._build_seconds = time.perf_counter() - start
        return self

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        self.attn.plan(batch)
        return self._model_forward(batch)

    def _model_forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.model.forward(batch, self.attn, self.kv)

    # ---- public API --------------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], sampling: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[Generation]:
        params = self._per_request(sampling or SamplingParams(), len(prompts))
        reqs = [self._new_request(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
        self._run(reqs)
        return [Generation(list(r.output), r.finish_reason) for r in reqs]

    def score(self, prompts: list[list[int]], continuations: list[list[int]], top_k: int = 5) -> list[Score]:
        """Teacher-forced log-probs, one decode step per continuation token (the serving path)."""
        self._check_pairs(prompts, continuations)
        reqs = []
        for i, (p, c) in enumerate(zip(prompts, continuations)):
            r = self._new_request(i, p, SamplingParams(max_new_tokens=len(c), ignore_eos=True), forced=c)
            r.top_k = top_k
            reqs.append(r)
        self._run(reqs)
        return [Score(r.token_logprobs, r.top_ids, r.top_logprobs) for r in reqs]

    def verify(self, prefixes: list[list[int]], drafts: list[list[int]], top_k: int = 5) -> list[Score]:
        """M-row verification: each draft is scored in ONE forward step after its prefix is cached."""
        self._check_pairs(prefixes, drafts)
        reqs = [self._new_request(i, p, SamplingParams(max_new_tokens=len(d), ignore_eos=True), forced=d)
                for i, (p, d) in enumerate(zip(prefixes, drafts))]
        results: list[Score] = []
        for start in range(0, len(reqs), self.options.max_batch_size):
            chunk = reqs[start : start + self.options.max_batch_size]
            try:
                for r in chunk:
                    self._admit(r, len(r.prompt) + len(r.forced))
                cached = [(r, r.prompt[:-1], 0) for r in chunk if len(r.prompt) > 1]
                if cached:
                    self._forward(self._extend_batch(cached, all_rows=False))
                rows = [(r, [r.prompt[-1]] + r.forced[:-1], len(r.prompt) - 1) for r in chunk]
                logprobs = torch.log_softmax(self._forward(self._extend_batch(rows, all_rows=True)), dim=-1)
                offset = 0
                for r in chunk:
                    m = len(r.forced)
                    results.append(_score_rows(logprobs[offset : offset + m], r.forced, top_k))
                    offset += m
            finally:
                for r in chunk:
                    self._release(r)
        return results

    def stats(self) -> dict:
        cfg, opts = self.config, self.options
        return {
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "dtype": str(self.dtype).removeprefix("torch."),
            "architecture": cfg.architecture,
            "attention_backend": self.attn.name if self.model else None,
            "kernel_backend": self.ops.name if self.model else None,
            "cuda_graph_batch_sizes": self.graphs.batch_sizes if self.graphs else [],
            "max_batch_size": opts.max_batch_size,
            "max_seq_len": self.max_seq_len,
            "page_size": opts.page_size,
            "kv_cache_bytes": self.kv.bytes if self.model else 0,
            "build_seconds": round(self._build_seconds, 3),
            **self._counters,
        }

    # ---- scheduling --------------------------------------------------------------------------------------------
    def _run(self, reqs: list[Request]) -> None:
        """Continuous batching: admit and prefill waiting requests when they fit, otherwise decode the running.

        Once nothing waits, decoding overlaps the host with the device, as vanilla mini-sglang's scheduler does:
        the next step is launched (its inputs are this step's tokens, still on the device) before this step's
        tokens are read, so the GPU does not idle while Python books them. A request that stops on a token it
        could not know in advance (EOS, a stop id) runs one step too many, whose token is dropped."""
        waiting, running = deque(reqs), []
        ahead: DecodeStep | None = None  # launched, tokens not read yet; only while nothing waits
        try:
            while waiting or running:
                admitted = self._admit_waiting(waiting, running)
                if admitted:
                    batch = self._extend_batch([(r, r.prompt, 0) for r in admitted], all_rows=False)
                    logits = self._forward(batch)
                    self._counters["prefill_steps"] += 1
                    running.extend(admitted)
                    self._advance(admitted, logits)
                else:
                    step = ahead or self._launch_decode(running)
                    ahead = None if waiting else self._launch_ahead(step)
                    self._advance(step.rows, step.logits, step.read_tokens())
                for r in [r for r in running if r.finish_reason]:
                    running.remove(r)
                    self._release(r)
        finally:
            for r in running:
                self._release(r)

    def _admit_waiting(self, waiting: deque, running: list) -> list[Request]:
        admitted, budget = [], self.options.max_prefill_tokens
        while waiting and len(running) + len(admitted) < self.options.max_batch_size:
            r = waiting[0]
            need = math.ceil(r.max_total_len / self.options.page_size)
            if need > self.allocator.free_pages or (admitted and len(r.prompt) > budget):
                break
            waiting.popleft()
            self._admit(r, r.max_total_len)
            admitted.append(r)
            budget -= len(r.prompt)
        if not admitted and not running and waiting:
            raise RuntimeError("KV cache too small for a single request; raise kv_cache_tokens")
        return admitted

    def _admit(self, r: Request, total_len: int) -> None:
        # Pages for the whole request up front: no preemption is ever needed.
        r.pages = self.allocator.allocate(math.ceil(total_len / self.options.page_size))
        r.row = self.page_table.assign(r.pages)

    def _release(self, r: Request) -> None:
        if r.pages:
            self.allocator.release(r.pages)
            self.page_table.release(r.row)
            r.pages = []

    def _extend_batch(self, items: list[tuple[Request, list[int], int]], all_rows: bool) -> ForwardBatch:
        """items: (request, new tokens, position of the first new token)."""
        ids, positions, slots, logit_rows, ext, seq, pages = [], [], [], [], [], [], []
        ps = self.options.page_size
        for r, tokens, start in items:
            ids += tokens
            pos = range(start, start + len(tokens))
            positions += pos
            slots += [r.slot(p, ps) for p in pos]
            end = len(ids)
            logit_rows += range(end - len(tokens), end) if all_rows else [end - 1]
            ext.append(len(tokens))
            seq.append(start + len(tokens))
            pages.append(tuple(r.pages[: math.ceil(seq[-1] / ps)]))
        width = math.ceil(max(seq) / ps)
        dev = self.device
        return ForwardBatch(
            is_decode=False, input_ids=_tensor(ids, dev), positions=_tensor(positions, dev),
            out_slots=_tensor(slots, dev), seq_lens=_tensor(seq, dev, torch.int32),
            page_table=self.page_table.table.index_select(0, _tensor([r.row for r, _, _ in items], dev))[:, :width],
            logit_rows=_tensor(logit_rows, dev), extend_lens=tuple(ext), seq_lens_host=tuple(seq),
            page_ids_host=tuple(pages))

    def _launch_decode(self, rows: list[Request], inputs: torch.Tensor | None = None) -> DecodeStep:
        logits = self._decode(rows, inputs)
        tokens = self._choose(rows, logits)
        if self.device.type != "cuda":
            return DecodeStep(rows, logits, tokens, tokens, None)
        tokens_host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        tokens_host.copy_(tokens, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return DecodeStep(rows, logits, tokens, tokens_host, copied)

    def _launch_ahead(self, step: DecodeStep) -> DecodeStep | None:
        """The step after `step`, for its rows that go on past it, launched before its tokens are read. None when
        a row's next input needs the host (a teacher-forced token) or no row goes on."""
        if any(r.forced is not None for r in step.rows):
            return None
        # A row whose token from `step` is its last by length is known now: no wasted step for it.
        keep = [i for i, r in enumerate(step.rows) if not r.finish_reason
                and len(r.output) + 1 < r.params.max_new_tokens and r.seq_len + 1 < r.max_total_len]
        if not keep:
            return None
        inputs = step.tokens if len(keep) == len(step.rows) else step.tokens[_tensor(keep, self.device)]
        return self._launch_decode([step.rows[i] for i in keep], inputs)

    def _decode(self, running: list[Request], inputs: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step. `inputs`: the rows' input tokens on the device, from a step whose tokens the host has
        not appended yet (so each row is one token further than its host state says)."""
        self._counters["decode_steps"] += 1
        bs, ps = len(running), self.options.page_size
        lag = 0 if inputs is None else 1
        padded = self.graphs.padded_size(bs) if self.graphs else None
        cols = [(0 if lag else r.output[-1], r.seq_len - 1 + lag, r.slot(r.seq_len - 1 + lag, ps), r.seq_len + lag,
                 r.row) for r in running]
        if padded:
            cols += [(0, 0, 0, 1, 0)] * (padded - bs)  # padding rows read/write the reserved page 0
        packed = _tensor(list(zip(*cols)), self.device)
        if inputs is not None:
            packed[0, :bs].copy_(inputs)
        seq_lens = tuple(c[3] for c in cols)
        pages = tuple(tuple(r.pages[: math.ceil(n / ps)]) for r, n in zip(running, seq_lens))
        pages += ((0,),) * (len(cols) - bs)
        if padded:
            self._counters["graph_replays"] += 1
            return self.graphs.replay(packed[:4], self.page_table.table.index_select(0, packed[4]), bs, seq_lens,
                                      pages)
        width = math.ceil(max(seq_lens) / ps)
        batch = ForwardBatch(is_decode=True, input_ids=packed[0], positions=packed[1], out_slots=packed[2],
                             seq_lens=packed[3].to(torch.int32),
                             page_table=self.page_table.table.index_select(0, packed[4])[:, :width],
                             logit_rows=torch.arange(bs, device=self.device), seq_lens_host=seq_lens,
                             page_ids_host=pages)
        return self._forward(batch)

    @staticmethod
    def _choose(reqs: list[Request], logits: torch.Tensor) -> torch.Tensor:
        """Each request's next token, greedy or sampled, on the logits' device (no host sync)."""
        chosen = logits.argmax(-1)
        for i, r in enumerate(reqs):
            if r.forced is None and not r.params.greedy:
                chosen[i] = sample(logits[i], r.params, r.generator)
        return chosen

    def _advance(self, reqs: list[Request], logits: torch.Tensor, chosen: list[int] | None = None) -> None:
        """Append each request's next token (forced, or `chosen`, read from a launched step) and record log-probs
        where asked. A request that already finished (a row decoded one step past its stop) takes nothing."""
        tokens = self._choose(reqs, logits).tolist() if chosen is None else chosen
        scored = [i for i, r in enumerate(reqs) if r.forced is not None]
        if scored:
            logprobs = torch.log_softmax(logits[scored], dim=-1)
            for row, i in enumerate(scored):
                r = reqs[i]
                tokens[i] = r.forced[len(r.output)]
                s = _score_rows(logprobs[row : row + 1], [tokens[i]], r.top_k)
                r.token_logprobs += s.token_logprobs
                r.top_ids += s.top_ids
                r.top_logprobs += s.top_logprobs
        live = [(r, t) for r, t in zip(reqs, tokens) if not r.finish_reason]
        for r, t in live:
            r.append(t)
        self._counters["generated_tokens"] += len(live)

    # ---- validation --------------------------------------------------------------------------------------------
    def _new_request(self, index: int, prompt, params: SamplingParams, forced: list[int] | None = None) -> Request:
        if self.model is None:
            raise RuntimeError("call build() before generate/score/verify")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"request {index}: sampling must be a SamplingParams, got {type(params).__name__}")
        try:
            params.validate()
        except ValueError as e:
            raise ValueError(f"request {index}: {e}") from None
        self._check_ids(index, "prompt", prompt)
        if forced is not None:
            self._check_ids(index, "continuation", forced)
        total = len(prompt) + (len(forced) if forced is not None else 0)
        if len(prompt) >= self.max_seq_len or total > self.max_seq_len:
            raise ValueError(f"request {index}: {total} tokens exceed the context limit of {self.max_seq_len}")
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed if params.seed is not None else self.options.seed + index)
        stop = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(self.eos_token_ids))
        max_total = min(len(prompt) + params.max_new_tokens, self.max_seq_len)
        return Request(index, list(prompt), params, max_total, stop, forced=forced, generator=generator)

    def _check_ids(self, index: int, what: str, ids) -> None:
        if not isinstance(ids, (list, tuple)) or not ids:
            raise ValueError(f"request {index}: {what} must be a non-empty list of token ids")
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.config.vocab_size]
        if bad:
            raise ValueError(f"request {index}: {what} has token ids outside [0, {self.config.vocab_size}): {bad[:5]}")

    def _check_pairs(self, a: list, b: list) -> None:
        if len(a) != len(b):
            raise ValueError(f"got {len(a)} prompts but {len(b)} continuations")

    @staticmethod
    def _per_request(sampling, n: int) -> list[SamplingParams]:
        if isinstance(sampling, SamplingParams):
            return [sampling] * n
        if len(sampling) != n:
            raise ValueError(f"got {n} prompts but {len(sampling)} sampling params")
        return list(sampling)


def _score_rows(logprobs: torch.Tensor, tokens: list[int], top_k: int) -> Score:
    chosen = logprobs.gather(1, torch.tensor(tokens, device=logprobs.device)[:, None])[:, 0]
    if top_k > 0:
        top = logprobs.topk(top_k, dim=-1)
        top_ids, top_lp = top.indices.tolist(), top.values.tolist()
    else:
        top_ids, top_lp = [[] for _ in tokens], [[] for _ in tokens]
    return Score(chosen.tolist(), top_ids, top_lp)


def _tensor(values, device: torch.device, dtype=torch.int64) -> torch.Tensor:
    # Pinned on CUDA, as vanilla mini-sglang's host tensors are: the copy is one DMA, not staged by the driver.
    return torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda").to(device, non_blocking=True)


def _default_graph_sizes(max_bs: int) -> list[int]:
    return sorted({s for s in [1, 2, 4, 8, *range(16, max_bs + 1, 8)] if s <= max_bs} | {max_bs})


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    return device


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in choices:
        raise ValueError(f"unknown dtype {name!r} (choose {', '.join(choices)})")
    return choices[name]
