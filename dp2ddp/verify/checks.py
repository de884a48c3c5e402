"""The verify checks, computed from the per-rank records the harness wrote."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class Check:
    id: int
    name: str
    title: str
    #: pass | fail | skip (does not apply to this script: a CPU run has no
    #: set_device) | inconclusive (could not be checked: the script never got there)
    status: str = "pass"
    message: str = ""
    rank: Optional[int] = None
    location: Optional[str] = None
    advice: Optional[str] = None
    details: Dict[str, Any] = field(default_factory=dict)

    def fail(self, message: str, rank=None, location=None, advice=None, **details) -> "Check":
        self.status, self.message, self.rank, self.location, self.advice = "fail", message, rank, location, advice
        self.details.update(details)
        return self

    def skip(self, message: str) -> "Check":
        self.status, self.message = "skip", message
        return self

    def inconclusive(self, message: str) -> "Check":
        self.status, self.message = "inconclusive", message
        return self

    def ok(self, message: str, **details) -> "Check":
        self.status, self.message = "pass", message
        self.details.update(details)
        return self

    def to_dict(self) -> Dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "message": self.message,
            "rank": self.rank,
            "location": self.location,
            "advice": self.advice,
            "details": self.details,
        }


def read_events(path: str) -> List[Dict[str, Any]]:
    """One run's record (JSON lines); [] when it is missing."""
    events = []
    try:
        with open(path) as handle:
            for line in handle:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass  # a line cut short by a kill
    except OSError:
        pass
    return events


@dataclass
class Records:
    """Every rank's events, by rank number."""

    ranks: Dict[int, List[Dict[str, Any]]]
    stacks: Dict[int, str]
    logs: Dict[str, str]

    @classmethod
    def load(cls, directory: str) -> "Records":
        ranks: Dict[int, List[Dict[str, Any]]] = {}
        stacks: Dict[int, str] = {}
        logs: Dict[str, str] = {}
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            match = re.fullmatch(r"rank(\d+)\.jsonl", name)
            if match:
                ranks[int(match.group(1))] = read_events(path)
            match = re.fullmatch(r"stack-rank(\d+)\.txt", name)
            if match:
                with open(path, errors="replace") as handle:
                    text = handle.read().strip()
                if text:
                    stacks[int(match.group(1))] = text
            if name.endswith(".log"):
                with open(path, errors="replace") as handle:
                    logs[name] = handle.read()
        return cls(ranks, stacks, logs)

    def events(self, rank: int, kind: str) -> List[Dict[str, Any]]:
        return [e for e in self.ranks.get(rank, []) if e.get("event") == kind]

    def output_tail(self, rank: int, lines: int = 12) -> str:
        """The end of what rank ``rank`` printed (its own log, fork launcher)."""
        text = self.logs.get(f"rank{rank}.log", "")
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def first(self, rank: int, kind: str) -> Optional[Dict[str, Any]]:
        found = self.events(rank, kind)
        return found[0] if found else None


def evaluate(records: Records, expected_world: int, launched, options) -> List[Check]:
    checks = [
        check_process_group(records, expected_world),
        check_wrapped(records),
        check_sharded(records),
        check_set_epoch(records, launched, options),
        check_in_sync(records),
        check_single_writer(records),
        check_no_hang(records, launched, options),
        check_no_crash(records, launched, options),
        check_devices(records),
    ]
    return checks


from dp2ddp.verify.harness import display as _display


#: how a collective fails when its peer process is gone (Gloo, NCCL, the store)
_LOST_PEER = re.compile(
    r"(?i)connection (reset|closed|refused)|broken pipe|ECONNRESET|peer|remote process exited|"
    r"communicator was aborted|DistNetworkError|DistBackendError"
)


def _left_early(records: "Records", crashed: int, crashes: Dict[int, Any]):
    """(rank, its steps, the crashed rank's steps) of a rank whose script ended
    normally having taken no more steps than the rank that then crashed, or None."""
    end = records.first(crashed, "end") or {}
    reached = end.get("steps", 0)
    for rank in sorted(records.ranks):
        if rank in crashes:
            continue
        other = records.first(rank, "end")
        if other and other.get("reason") == "completed" and other.get("steps", 0) <= reached:
            return rank, other.get("steps", 0), reached
    return None


def _exits(records: "Records") -> Dict[int, Dict[str, Any]]:
    """The ranks whose script left through ``os._exit`` (no ``end`` event): their ``exit`` event."""
    found = {}
    for rank in sorted(records.ranks):
        event = records.first(rank, "exit")
        if event is not None and records.first(rank, "end") is None:
            found[rank] = event
    return found


def _steps(records: "Records", rank: int) -> Optional[int]:
    """The optimizer steps rank ``rank`` took, as its last record says (None: killed, unknown)."""
    for kind in ("end", "exit"):
        event = records.first(rank, kind)
        if event is not None:
            return event.get("steps", 0)
    return None


def _blocked(records: "Records") -> List[int]:
    """The ranks still in the script when the run was stopped (no end, no exit)."""
    return [r for r in sorted(records.ranks) if records.first(r, "end") is None and records.first(r, "exit") is None]


def _stopped_at_timeout(records: "Records", options) -> str:
    """What a stall means for the checks that could not finish: the run was stopped
    at its time budget while these ranks were blocked (where, from their stacks)."""
    blocked = _blocked(records)
    where = {r: _stack_location(records.stacks.get(r, "")) for r in blocked}
    ranks = ", ".join(f"rank {r}" + (f" (at {where[r]})" if where.get(r) else "") for r in blocked)
    verb = "was" if len(blocked) == 1 else "were"
    return (
        f"the run was stopped at its time budget (no progress for --timeout {options.timeout:g} s) while "
        + (f"{ranks} {verb} blocked (check 7)" if blocked else "the ranks were blocked (check 7)")
    )


def _last_line(crash: Dict[str, Any]) -> str:
    text = (crash.get("traceback") or "").strip()
    return text.splitlines()[-1] if text else "crashed"


# 1 -------------------------------------------------------------------------
def check_process_group(records: Records, expected: int) -> Check:
    check = Check(1, "process-group", "process group initialised on every rank")
    missing = [r for r in range(expected) if r not in records.ranks]
    if missing:
        return check.fail(
            f"rank(s) {missing} never started the script",
            advice="look at the launcher output in the run folder",
        )
    backends = set()
    for rank in range(expected):
        init = records.first(rank, "init")
        if init is None:
            crash = records.first(rank, "crash")
            if crash is not None and records.first(rank, "first_step") is None:
                return check.fail(
                    f"rank {rank} exited before init_process_group: {_last_line(crash)}",
                    rank=rank,
                    location=crash.get("where"),
                    advice="see the script's output below and check 8",
                    output=records.output_tail(rank),
                )
            if "init_process_group" in records.stacks.get(rank, ""):
                return check.fail(
                    f"rank {rank} was still waiting in init_process_group: another rank never joined",
                    rank=rank,
                    advice="see which rank never reached init_process_group in the stacks (check 7)",
                )
            end = records.first(rank, "end")
            if records.first(rank, "first_step") is None and end is not None and end.get("reason") == "completed":
                return check.fail(
                    f"rank {rank} ended (exit status 0) before init_process_group, without a training step",
                    rank=rank,
                    advice="see the script's output below: pass its arguments after `--` if it needs some",
                    output=records.output_tail(rank),
                )
            step = records.first(rank, "first_step") or {}
            return check.fail(
                f"rank {rank} never called init_process_group: each process trains on its own",
                rank=rank,
                location=step.get("where"),
                advice="call dist.init_process_group() at the start (dp2ddp convert adds it)",
            )
        if init["world_size"] != expected or init["rank"] != rank:
            return check.fail(
                f"rank {rank} joined as rank {init['rank']} of {init['world_size']}, expected {rank} of {expected}",
                rank=rank,
                location=init.get("where"),
                advice="let torchrun's RANK/WORLD_SIZE drive init_process_group (no hard-coded world size)",
            )
        backends.add(init["backend"])
    return check.ok(f"{expected} ranks, backend {', '.join(sorted(backends))}", backend=sorted(backends))


# 2 -------------------------------------------------------------------------
def check_wrapped(records: Records) -> Check:
    check = Check(2, "ddp-wrapped", "the model the optimizer trains is wrapped in DistributedDataParallel")
    seen = False
    for rank in sorted(records.ranks):
        first = records.first(rank, "first_step")
        if first is None:
            continue
        seen = True
        if first["wrapped"] < first["params"]:
            return check.fail(
                f"rank {rank}: the optimizer trains {first['params']} parameters, only "
                f"{first['wrapped']} of them in a DistributedDataParallel model: the gradients of "
                f"the other {first['params'] - first['wrapped']} are never averaged across ranks",
                rank=rank,
                location=first.get("where"),
                advice="wrap the model in DistributedDataParallel before building the optimizer",
            )
    if not seen:
        return check.inconclusive("no optimizer step was taken")
    return check.ok("every parameter the optimizer trains is in a DDP model")


# 3, 4 ------------------------------------------------------------------------
def _training_passes(records: Records, rank: int) -> List[Dict[str, Any]]:
    passes = records.events(rank, "pass")
    return [p for p in passes if p["end_step"] > p["start_step"]]


def check_sharded(records: Records) -> Check:
    check = Check(3, "data-sharded", "training data sharded: disjoint across ranks, covering the dataset")
    ranks = sorted(records.ranks)
    world = len(ranks)
    first_passes = {}
    for rank in ranks:
        passes = _training_passes(records, rank)
        if passes:
            first_passes[rank] = passes[0]
    if len(first_passes) < world or not first_passes:
        return check.inconclusive(
            "cannot be told: no training pass over a DataLoader was seen on every rank (data "
            "that does not come from a DataLoader -- a tensor cut into batches by hand -- is not observed)"
        )
    sample = first_passes[ranks[0]]
    location = sample.get("where")
    n = sample.get("dataset_len")
    if world == 1:
        return check.ok("a single rank: nothing to shard")
    if sample.get("iterable"):  # no indices: what the ranks received, by content
        return _sharded_by_content(check, first_passes, location, "an iterable dataset")
    shards = {r: p.get("shard") for r, p in first_passes.items()}
    subsets = [p.get("subset") for p in first_passes.values()]
    if all(s is not None for s in shards.values()) and all(s is not None for s in subsets):
        if any(sub != subsets[0] for sub in subsets[1:]):
            if len({len(sub) for sub in subsets}) == 1 and len(set().union(*map(set, subsets))) < sum(map(len, subsets)):
                return check.fail(
                    "each rank has a different Subset of the same size, overlapping the others' (a "
                    "random_split drawn on each rank, unseeded?): the ranks shard different training "
                    "sets, train on overlapping samples, and some on samples that another rank validates on",
                    location=location,
                    advice="split alike on every rank: random_split(..., generator=torch.Generator().manual_seed(0))",
                )
            return check.fail(
                "the data is sharded twice: each rank has its own Subset and a DistributedSampler "
                "shards that again -- part of the dataset is never trained on",
                location=location,
                advice="shard once: one Subset/dataset for all ranks with a DistributedSampler",
            )
    if all(s is not None for s in shards.values()):
        union = set()
        total = 0
        for shard in shards.values():
            union |= set(shard)
            total += len(shard)
        duplicates = total - len(union)
        expected_padding = 0
        if n:
            per_rank = -(-n // world)
            expected_padding = per_rank * world - n if not sample.get("drop_last") else 0
        overlap_per_rank = [len(set(s)) for s in shards.values()]
        if n and all(size >= n for size in overlap_per_rank):
            return check.fail(
                f"every rank draws all {n} samples: the data is not sharded",
                location=location,
                advice="build the DistributedSampler with the process group's rank and world size (the defaults)",
            )
        if duplicates > expected_padding:
            return check.fail(
                f"ranks draw {duplicates} sample{'s' if duplicates != 1 else ''} more than once "
                f"(padding explains {expected_padding})",
                location=location,
                advice="give each rank its own shard: DistributedSampler(dataset) with the default rank/num_replicas",
            )
        missing = (n - len(union)) if n else 0
        if missing > 0 and not sample.get("drop_last"):
            return check.fail(
                f"{missing} of {n} samples are never drawn by any rank",
                location=location,
                advice="do not pass num_replicas/rank by hand",
            )
        note = f"{world} disjoint shards covering {len(union)} of {n} samples"
        if duplicates:
            note += f" ({duplicates} padding duplicate{'s' if duplicates != 1 else ''}: {n} is not a multiple of {world})"
        if missing:
            note += f" ({missing} dropped by drop_last)"
        return check.ok(note, padding=duplicates, dataset=n)
    # no DistributedSampler: the loader's own sampler
    subsets = [p.get("subset") for p in first_passes.values()]
    if all(s is not None for s in subsets):  # each rank its own Subset: a shard made by hand?
        union = set().union(*map(set, subsets))
        if len(union) == sum(len(s) for s in subsets):
            sizes = sorted({len(s) for s in subsets})
            batch, drop = sample.get("batch_size"), sample.get("drop_last")
            steps = {
                (len(sub) // batch if drop else -(-len(sub) // batch)) if batch else len(sub) for sub in subsets
            }
            if len(steps) > 1:  # (20 and 19 samples in batches of 4: 5 steps each -- fine)
                return check.fail(
                    f"each rank trains on its own Subset, but of different sizes ({', '.join(map(str, sizes))} "
                    f"samples, {', '.join(map(str, sorted(steps)))} batches): the ranks take different numbers "
                    "of steps, and the one that goes on waits in a collective for the ones that stopped",
                    location=location,
                    advice="give every rank as many samples (DistributedSampler pads or drops to make it so)",
                )
            whole = sample.get("subset_of")
            return check.ok(
                f"each rank trains on its own Subset: {world} disjoint shards of {len(union)} samples"
                + (f" of {whole}" if whole else "")
            )
    lengths = {r: p.get("sampler_len") for r, p in first_passes.items()}
    if n and all(length == n for length in lengths.values()):
        via = sample.get("batch_sampler")
        return check.fail(
            f"every rank iterates the whole dataset ({n} samples, "
            + (f"{via}({sample.get('sampler')})" if via else str(sample.get("sampler")))
            + "): each trains on the same data",
            location=location,
            advice=f"give the {via} a DistributedSampler(dataset, shuffle=...)" if via
            else "give the training DataLoader sampler=DistributedSampler(dataset, shuffle=...)",
        )
    drawn = [set(p["indices"]) for p in first_passes.values()]
    if not all(drawn):  # a sampler whose indices are not integers
        return _sharded_by_content(check, first_passes, location, f"{sample.get('sampler')}'s indices unread")
    overlap = set.intersection(*drawn) if drawn else set()
    if overlap:
        own = sample.get("sampler") if sample.get("own_batches") else None
        return check.fail(
            f"ranks draw the same samples ({len(overlap)} shared in the first epoch)",
            location=location,
            advice=f"make {own} give each rank its own part of the indices (e.g. draw from "
            "DistributedSampler(dataset)'s shard, or keep every world_size-th batch from rank on)"
            if own else "use a DistributedSampler",
        )
    return check.ok("ranks drew disjoint samples (custom sampler; coverage not checked)")


def _order(p: Dict[str, Any]) -> List[Any]:
    """The order a pass's sampler produced: the indices it drew (as many as the
    epoch's batch limit let it), else a DistributedSampler's shard, else -- an
    iterable dataset -- the fingerprints of the samples the loop received."""
    return list(p.get("indices") or p.get("shard") or [fp for _, fp in p.get("samples") or ()])


#: a share of identical samples on several ranks from which the data is said to overlap
#: (below it: duplicates in the data, or a partial overlap -- cannot be told)
OVERLAP_SHARE = 0.25


def _sharded_by_content(check: Check, first_passes: Dict[int, Dict[str, Any]], location, what: str) -> Check:
    """Sharding judged by the content of the samples each rank received (their
    fingerprints): disjoint, overlapping, or cannot be told -- never a pass for
    what could not be seen."""
    prints = {r: [fp for _, fp in p.get("samples") or ()] for r, p in first_passes.items()}
    if not all(prints.values()):
        return check.inconclusive(
            f"cannot be told ({what}): the batches carry no sample indices and could not be compared by "
            "content (not tensors, or their parts disagree on the batch size)"
        )
    seen: Dict[str, set] = {}
    for rank, values in prints.items():
        for fp in values:
            seen.setdefault(fp, set()).add(rank)
    shared = {fp for fp, owners in seen.items() if len(owners) > 1}
    fewest = min(len(set(v)) for v in prints.values())
    compared = ", ".join(f"rank {r}: {len(v)}" for r, v in sorted(prints.items()))
    if not shared:
        return check.ok(
            f"ranks received disjoint samples ({what}; compared by content, {compared} samples; coverage not checked)"
        )
    if len(shared) >= OVERLAP_SHARE * fewest:
        return check.fail(
            f"ranks receive the same samples ({what}): {len(shared)} of the {fewest} distinct samples "
            "a rank received (compared by content) reach another rank too",
            location=location,
            advice="shard the stream by rank: in the dataset's __iter__ keep every world_size-th sample "
            "from dist.get_rank() on (and split it across workers with get_worker_info())"
            if "iterable" in what else "use a DistributedSampler",
        )
    return check.inconclusive(
        f"cannot be told ({what}): {len(shared)} identical samples reach several ranks ({compared} compared by "
        "content): duplicates in the data, or a partial overlap"
    )


def first_training_pass(events: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    passes = [e for e in events if e.get("event") == "pass" and e["end_step"] > e["start_step"]]
    return passes[0] if passes else None


def data_disagreement(passes: Dict[str, Optional[Dict[str, Any]]]) -> Optional[str]:
    """Whether processes hold different samples for the same index: ``passes``
    maps a process's name ("rank 0", "the original's run") to its first training
    pass; the fingerprints of the samples it received are compared index by index.
    A sentence saying where they differ, or None (the same, or nothing in common)."""
    seen: Dict[int, tuple] = {}
    for name, record in passes.items():
        for index, fp in (record or {}).get("samples") or ():
            if index is None:
                continue
            if index not in seen:
                seen[index] = (name, fp)
            elif seen[index][1] != fp and seen[index][0] != name:
                first = seen[index][0]
                differ = sum(
                    1 for other in passes.values() for i, f in (other or {}).get("samples") or ()
                    if i is not None and i in seen and seen[i][1] != f
                )
                source = record.get("dataset") or "the dataset"
                defined = record.get("dataset_defined")
                return (
                    f"the data is not deterministic across processes: sample {index} of the training set is "
                    f"not the same in {first} and {name} ({differ} sample(s) of the same index differ); "
                    f"{source}" + (f" (defined at {defined})" if defined else "")
                    + " draws or builds its samples in each process (random numbers without a seed, "
                    "a random augmentation?): seed it before building the dataset, or load the data from a file"
                )
    return None


def check_set_epoch(records: Records, launched=None, options=None) -> Check:
    check = Check(4, "set-epoch", "shuffling changes between epochs (set_epoch called)")
    rank = min(records.ranks) if records.ranks else None
    if rank is None:
        return check.inconclusive("no rank ran")
    passes = _training_passes(records, rank)
    if not passes:
        return check.inconclusive("no training pass over a DataLoader was seen")
    first = passes[0]
    passes = [p for p in passes if p.get("loader") == first.get("loader")]  # one loader's epochs
    if first.get("shuffle") is False:
        return check.ok("the training sampler does not shuffle: nothing to change between epochs")
    if len(passes) < 2:
        end = records.first(rank, "end") or {}
        if launched is not None and launched.stalled:
            why = ": " + _stopped_at_timeout(records, options)
        elif (launched is not None and launched.crashed) or records.first(rank, "crash") or _exits(records):
            why = ": the run ended early (a rank crashed or left: check 8)"
        elif end.get("reason") == "budget":
            why = ": the step budget ended the run first -- raise --max-steps or lower --epoch-batches"
        else:
            why = ": the script ran one epoch (give it two, through its arguments after `--`)"
        return check.inconclusive("only one epoch of the training loader was seen" + why)
    orders = [_order(p) for p in passes]
    common = min(len(order) for order in orders)
    if common < 2:
        return check.inconclusive(
            "the order of the samples could not be read in two epochs (no indices, no tensors to fingerprint)"
        )
    same = all(order[:common] == orders[0][:common] for order in orders[1:])
    what = f"the first {common} samples of {len(passes)} epochs"
    if first.get("shuffle") is None:  # a sampler of the project's own, an iterable dataset: judged by what it drew
        source = "the iterable dataset" if first.get("iterable") else f"{first.get('sampler') or 'the sampler'} (the project's own)"
        if first.get("iterable"):
            what += " (their content)"
        if same:
            return check.ok(
                f"{source} gave the same order in {what}: "
                "fine if it does not shuffle; if it does, it needs the epoch (a set_epoch of its own)"
            )
        return check.ok(f"{source}: {len(passes)} epochs, each in a new order ({what} compared)")
    if same:
        return check.fail(
            f"all {len(passes)} epochs draw the samples in the same order ({what} compared)",
            rank=rank,
            location=first.get("where"),
            advice="call loader.sampler.set_epoch(epoch) at the top of every epoch",
        )
    return check.ok(f"{len(passes)} epochs, each in a new order ({what} compared)")


# 5 -------------------------------------------------------------------------
def check_in_sync(records: Records) -> Check:
    check = Check(5, "in-sync", "parameters identical on all ranks after the first and the last step")
    firsts = {r: records.first(r, "first_step") for r in records.ranks}
    lasts = {r: records.first(r, "last_step") for r in records.ranks}
    if not any(firsts.values()):
        return check.inconclusive("no optimizer step was taken")
    if len(records.ranks) == 1:
        return check.skip("a single rank: nothing to compare")
    # identical parameters mean something only when DDP keeps them so: processes that
    # each train on their own (no process group, no DDP model) are identical when they
    # compute the same thing (same seed, same data), and differ when they do not
    alone = sorted(
        r for r in records.ranks
        if records.first(r, "init") is None or (firsts.get(r) and firsts[r]["wrapped"] == 0)
    )
    for label, table in (("first", firsts), ("last", lasts)):
        values = {r: e["checksum"] for r, e in table.items() if e}
        if len(values) < len(records.ranks):
            if label == "last":
                continue
            return check.inconclusive(f"some ranks took no {label} step")
        reference = values[min(values)]
        differ = [r for r, v in values.items() if v["hash"] != reference["hash"]]
        if differ:
            gap = max(abs(values[r]["sum"] - reference["sum"]) for r in differ)
            return check.fail(
                f"after the {label} step, rank(s) {differ} hold different parameters than rank "
                f"{min(values)} (sum differs by {gap:.3g})",
                rank=differ[0],
                location=(table[differ[0]] or {}).get("where"),
                advice="every rank must train the same DDP-wrapped model; do not change parameters on one rank only",
            )
    if alone:
        return check.inconclusive(
            f"identical, but nothing keeps them so: rank(s) {alone} train no DistributedDataParallel model "
            "in a process group (checks 1, 2) -- each process trained on its own, and computed the same"
        )
    if not all(lasts.values()):
        return check.ok("identical after the first step (the run did not end normally: no last step recorded)")
    steps = max(e["steps"] for e in lasts.values())
    return check.ok(f"identical after step 1 and step {steps}" if steps > 1 else "identical after the one step")


# 6 -------------------------------------------------------------------------
def check_single_writer(records: Records) -> Check:
    check = Check(6, "single-writer", "checkpoints and logs written by one rank only")
    writers: Dict[str, List[int]] = {}
    where: Dict[str, Optional[str]] = {}
    for rank in sorted(records.ranks):
        for event in records.events(rank, "write"):
            writers.setdefault(event["path"], []).append(rank)
            if rank != 0 or event["path"] not in where:
                where[event["path"]] = event.get("where")
    shared = {p: rs for p, rs in writers.items() if len(set(rs)) > 1}
    if shared:
        path, ranks = sorted(shared.items())[0]
        return check.fail(
            f"{_display(path)} is written by ranks {sorted(set(ranks))}"
            + (f" (and {len(shared) - 1} more file(s))" if len(shared) > 1 else ""),
            rank=sorted(set(ranks))[1],
            location=where.get(path),
            advice="write from the main process only: if dist.get_rank() == 0",
            files=sorted(shared),
        )
    if not writers:
        return check.ok("no file written")
    summary = ", ".join(f"{_display(p)} (rank {rs[0]})" for p, rs in sorted(writers.items())[:4])
    return check.ok(f"each file has one writer: {summary}", files=sorted(writers))


# 7, 8 ----------------------------------------------------------------------
def _stack_location(stack: str) -> Optional[str]:
    """Innermost frame of the main thread in user code, from a faulthandler dump."""
    lines = stack.splitlines()
    frames = [ln.strip() for ln in lines if ln.strip().startswith('File "')]
    for frame in frames:  # faulthandler prints the innermost frame first
        match = re.match(r'File "([^"]+)", line (\d+)', frame)
        if match and "site-packages" not in match.group(1) and "/dp2ddp/verify/" not in match.group(1):
            if not match.group(1).startswith("<"):
                return f"{_display(match.group(1))}:{match.group(2)}"
    return None


def check_no_hang(records: Records, launched, options) -> Check:
    check = Check(7, "no-hang", f"no rank stalls (timeout {options.timeout:g} s)")
    if not launched.stalled:
        return check.ok("every rank kept making progress")
    stuck = {r: s for r, s in records.stacks.items()}
    where = {r: _stack_location(s) for r, s in stuck.items()}
    ended = [r for r in records.ranks if records.first(r, "end") or records.first(r, "exit")]
    rank = min(stuck) if stuck else None
    message = f"no progress for {options.timeout:g} s"
    if ended:
        message += f"; rank(s) {sorted(ended)} had already left the script"
    if where:
        message += "; stuck at " + ", ".join(f"rank {r}: {w}" for r, w in sorted(where.items()) if w)
    return check.fail(
        message,
        rank=rank,
        location=where.get(rank) if rank is not None else None,
        advice="a collective (barrier, all_reduce, DDP backward) reached by some ranks only: "
        "move it out of rank-dependent branches and make every rank run the same number of steps",
        stacks={str(r): s for r, s in stuck.items()},
    )


def _early_exit(records: Records, launched, crashes: Dict[int, Any]) -> Optional[Check]:
    """A rank that left through ``os._exit`` while the others were still training:
    its arguments for the verdict (rank, what happened, where), or None."""
    exits = _exits(records)
    for rank, event in sorted(exits.items(), key=lambda item: (item[1].get("t", 0), item[0])):
        status, steps = event.get("status"), event.get("steps", 0)
        others = [r for r in sorted(records.ranks) if r != rank]
        went_on = [r for r in others if (_steps(records, r) or 0) > steps or r in _blocked(records)]
        later = [r for r in crashes if crashes[r].get("t", 0) >= event.get("t", 0)]
        if status not in (0, None):
            return dict(
                message=f"rank {rank} left with os._exit({status}) after {steps} step(s)"
                + (f" while rank(s) {went_on} went on" if went_on else ""),
                rank=rank,
                location=event.get("where"),
                advice="see the script's output below: os._exit leaves without a traceback",
            )
        if not (went_on or later or launched.stalled):
            continue  # every rank left there, after as many steps: the script's way to end
        what = f"rank {rank} left with os._exit(0) after {steps} step(s), before the end of training"
        if later:
            what += f"; rank(s) {sorted(later)} then failed in a collective: {_last_line(crashes[min(later)])}"
        elif launched.stalled:
            what += f"; rank(s) {_blocked(records)} then waited for it until the run was stopped (check 7)"
        elif went_on:
            what += f"; rank(s) {went_on} went on training without it"
        return dict(
            message=what,
            rank=rank,
            location=event.get("where"),
            advice="os._exit skips the rest of the script on this rank: every rank must run the same "
            "steps -- leave the training loop on every rank alike, and exit after the last collective",
        )
    return None


def check_no_crash(records: Records, launched, options=None) -> Check:
    check = Check(8, "no-crash", "no rank crashed")
    crashes = {r: records.first(r, "crash") for r in records.ranks}
    crashes = {r: c for r, c in crashes.items() if c}
    early = _early_exit(records, launched, crashes)
    if early is not None:
        return check.fail(**early, output=records.output_tail(early["rank"]), ranks=sorted(crashes))
    if crashes:
        # the first rank to crash is the cause; the others die of its absence
        rank = min(crashes, key=lambda r: (crashes[r].get("t", 0), r))
        crash = crashes[rank]
        last = _last_line(crash)
        left = _left_early(records, rank, crashes)
        if left is not None and _LOST_PEER.search(crash.get("traceback") or ""):
            early, steps, reached = left
            batches = {r: sum(e.get("batches", 0) for e in records.events(r, "pass")) for r in (early, rank)}
            what = (
                f"rank {early} left the training loop early (its script ended after {steps} step(s)) "
                f"while rank {rank} went on"
                if steps < reached or batches[early] < batches[rank] else
                f"rank {early}'s script ended after the same {steps} step(s) while rank {rank} was still "
                "in a collective (one that only some ranks reach: a barrier or all_reduce under a rank "
                "condition?)"
            )
            return check.fail(
                f"{what}; rank {rank} then failed in a collective (below): {last}",
                rank=rank,
                location=crash.get("where"),
                advice="every rank must run the same steps: look for a break/return or a loop "
                "length that depends on the rank or on the rank's data (dp2ddp lint: DDP305)",
                traceback=crash["traceback"],
                ranks=sorted(crashes),
            )
        exited = last.startswith("SystemExit")
        return check.fail(
            f"rank {rank} {'exited' if exited else 'crashed'}: {last}; the other ranks were stopped",
            rank=rank,
            location=crash.get("where"),
            advice="see the script's output below (its arguments? pass them after --)"
            if exited else (
                "its peer broke off a collective: the ranks ran different collectives -- one "
                "under a rank condition (`if rank == 0: dist.all_reduce(...)`: dp2ddp lint DDP305) "
                "meets the other ranks' next one (DDP's gradient all-reduce)"
                if _LOST_PEER.search(crash.get("traceback") or "") else "see the traceback"
            ),
            traceback=crash["traceback"],
            output=records.output_tail(rank),
            ranks=sorted(crashes),
        )
    if launched.crashed and not launched.stalled:
        codes = sorted(set(launched.exit_codes.values()) - {0})
        return check.fail(
            f"a process exited with status {codes} without a Python traceback (killed? out of memory?)",
            advice="look at the logs in the run folder (--keep)",
        )
    if launched.stalled:
        return check.inconclusive(
            "no rank crashed before " + (_stopped_at_timeout(records, options) if options else "the run was stopped")
            + ": what they would have done after is not known"
        )
    exits = _exits(records)
    reasons = {(records.first(r, "end") or {}).get("reason") for r in records.ranks} - {None}
    if exits:
        return check.ok(f"every rank finished (rank(s) {sorted(exits)} through os._exit(0), after as many steps)")
    if reasons == {"budget"}:
        return check.ok("every rank was stopped at the step budget")
    if reasons == {"completed"}:
        return check.ok("every rank finished the script")
    return check.ok("every rank finished the script or was stopped at the step budget")


def physical_gpu(index: Optional[int], visible: Optional[str]) -> Optional[int]:
    """The GPU a CUDA device index names when CUDA_VISIBLE_DEVICES was ``visible``
    (a list of numbers: index 0 is its first entry); the index itself otherwise
    (unset, or UUIDs: not comparable across ranks)."""
    if index is None or not visible:
        return index
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    if not all(v.isdigit() for v in entries) or index >= len(entries):
        return index
    return int(entries[index])


def check_devices(records: Records) -> Check:
    """Each rank computes on the GPU of its LOCAL_RANK: the index given to
    ``torch.cuda.set_device`` and the device of the DDP-wrapped model, both read
    through CUDA_VISIBLE_DEVICES (a script that narrows it to its own GPU per rank
    and then uses device 0 is right), compared with the GPU LOCAL_RANK names under
    the launch's CUDA_VISIBLE_DEVICES."""
    check = Check(9, "local-device", "each rank uses the GPU of its LOCAL_RANK")
    calls = 0
    for rank in sorted(records.ranks):
        start = records.first(rank, "start") or {}
        local_rank = start.get("local_rank")
        expected = physical_gpu(local_rank, start.get("visible"))
        uses = [("set_device", e, e.get("index")) for e in records.events(rank, "set_device")]
        uses += [("the DDP-wrapped model", e, e.get("cuda_device")) for e in records.events(rank, "ddp")
                 if e.get("cuda_device") is not None]
        for what, event, index in uses:
            if index is None:
                continue
            calls += 1
            gpu = physical_gpu(index, event.get("visible"))
            if gpu != expected:
                return check.fail(
                    f"rank {rank}: {what} is on GPU {index}"
                    + (f" (GPU {gpu} of the machine)" if gpu != index else "")
                    + f" but its LOCAL_RANK is {local_rank}"
                    + (" (the global rank used as a device index?)" if index == rank and rank != local_rank else ""),
                    rank=rank,
                    location=event.get("where"),
                    advice="use LOCAL_RANK for devices, RANK only for 'am I the main process'",
                )
    if not calls:
        return check.skip("no CUDA device chosen (CPU run)")
    return check.ok("every set_device call and DDP model used the GPU of LOCAL_RANK")
