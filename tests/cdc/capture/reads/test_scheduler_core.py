"""Property tests of the read scheduler's decisions (:mod:`cdc.capture.reads.scheduler_core`), without I/O.

A model of the tables and the stream drives :class:`SchedulerCore` as its shell does, over random
interleavings of passes of the loop (chunks read, locks waited for, time going by), discoveries, the
stream moving (and transactions waiting to be appended), truncates, changes of a table's columns,
reconnects, kills (restart from what is durable) and cancellations. Invariants checked after every step:

* never more reads under way and waiting for the stream than ``concurrency``;
* only the first ``concurrency`` reads take chunks, and no read is chunked after it stopped (cancelled,
  suspended, started over, its session lost): a read that goes on is a new one;
* a read ends only once the stream reached the end of WAL its snapshot saw, with nothing pending;
* a read by key never reads again a chunk that is durable, across kills and suspensions (only a
  truncate or a change of its columns starts it over);
* no read by key with a durable key keeps its snapshot ``renew_seconds`` past the pass that found it old;
* once events stop, every table wanted is read to its end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.capture.lsn import Lsn
from cdc.capture.reads.scheduler_core import (
    End,
    Reached,
    ReadFacts,
    SchedulerCore,
    StartOver,
    Stop,
    StopPartial,
    Suspend,
)

RENEW = 2.0
LOCK_CHECK = 0.05
TABLES = 4


@dataclass
class Table:
    """A table to read: ``chunks`` chunks, by key or by block ranges; what the log holds of its read."""

    chunks: int
    keyed: bool
    partial: bool = False
    durable: int = 0  # chunks of the current read the log holds (kept across kills for a read by key)
    generation: int = 0  # a new one each time the read starts over from its first chunk
    read_chunks: set[tuple[int, int]] = field(default_factory=set)  # (generation, chunk) read so far
    done: bool = False
    wanted: bool = True
    cancelled: bool = False


@dataclass
class Read:
    """A read under way: its table, its snapshot's time and end of WAL."""

    handle: int
    table: int
    started: float
    end: int
    finishing: bool = False
    abandoned: bool = False


class World:
    """The shell's side, in memory: the reads under way, the snapshots waiting for the stream, the stream."""

    def __init__(self, tables: list[Table], concurrency: int) -> None:
        self.tables = tables
        self.concurrency = concurrency
        self.core = SchedulerCore(concurrency, RENEW, LOCK_CHECK)
        self.handles = count(1)
        self.reads: list[Read] = []
        self.waiting: list[tuple[int, int, int]] = []  # (table, boundary, end of WAL seen)
        self.stopped: set[int] = set()  # handles of reads that stopped: never chunked again
        self.now = 0.0
        self.server_end = 100
        self.pending = False

    # -- what the shell tells the core ---------------------------------------------------------------

    def facts(self, reads: list[Read] | None = None) -> list[ReadFacts]:
        return [
            ReadFacts(
                read.handle,
                partial=self.tables[read.table].partial,
                resumable=self.tables[read.table].keyed and self.tables[read.table].durable > 0,
                finishing=read.finishing,
                abandoned=read.abandoned,
                started=read.started,
            )
            for read in (self.reads if reads is None else reads)
        ]

    def read_of(self, handle: int) -> Read:
        return next(read for read in self.reads if read.handle == handle)

    def under_way(self, table: int) -> bool:
        return any(read.table == table for read in self.reads) or any(t == table for t, _, _ in self.waiting)

    # -- carrying out decisions ---------------------------------------------------------------------

    def carry_out(self, stop: Stop) -> None:
        read = self.read_of(stop.read)
        table = self.tables[read.table]
        self.reads.remove(read)
        self.stopped.add(read.handle)
        match stop:
            case Suspend():
                assert table.keyed and table.durable > 0, "suspended a read with nothing to go on from"
            case StopPartial():
                assert table.partial
            case StartOver() | End():
                assert not (table.keyed and table.durable > 0 and not table.partial), "a durable read started over"
                self.start_over(table)
        table.wanted = not table.done and not table.cancelled

    @staticmethod
    def start_over(table: Table) -> None:
        table.durable = 0
        table.generation += 1

    def discover(self) -> None:
        """Snapshots for the wanted tables, as many as there is room for, at the stream's reach."""
        wanted = [i for i, t in enumerate(self.tables) if t.wanted and not self.under_way(i)]
        if not self.core.wants_discovery(bool(wanted), len(self.reads), len(self.waiting)):
            return
        self.core.discovered()
        for index in wanted:
            if self.core.room(len(self.reads), len(self.waiting)) <= 0:
                break
            self.waiting.append((index, self.server_end + 1, self.server_end + 8))

    def stream(self, advance: int, pending: bool) -> None:
        self.server_end += advance
        self.pending = pending
        for entry in [entry for entry in self.waiting if entry[1] <= self.server_end]:
            self.waiting.remove(entry)
            index, _, end = entry
            table = self.tables[index]  # a read that goes on after its last chunk only waits for the stream
            self.reads.append(Read(next(self.handles), index, self.now, end, finishing=table.durable >= table.chunks))

    def one_pass(self, dt: float, blocking: int) -> None:
        """A pass of the loop, in the shell's order: locks, renewals, then one chunk."""
        self.now += dt
        if self.core.lock_check_due(self.now):
            blocked = {read.handle for i, read in enumerate(self.reads) if blocking >> i & 1}
            for stop in self.core.give_way(self.facts(), blocked):
                assert stop.read in blocked and not self.read_of(stop.read).finishing
                self.carry_out(stop)
            if blocked:
                return
        renewed = self.core.renewals(self.facts(), self.now)
        for stop in renewed:
            read = self.read_of(stop.read)
            assert self.now - read.started >= RENEW and not read.finishing
            self.carry_out(stop)
        if renewed:
            return
        for read in self.reads:  # no snapshot kept past the pass that found it old
            table = self.tables[read.table]
            if table.keyed and table.durable > 0 and not read.finishing:
                assert self.now - read.started < RENEW
        handle = self.core.next_chunk(self.facts())
        if handle is None:
            assert not self.reads
            return
        assert handle not in self.stopped, "a stopped read was chunked"
        assert handle in [read.handle for read in self.reads[: self.concurrency]]
        self.chunk(self.read_of(handle))

    def chunk(self, read: Read) -> None:
        table = self.tables[read.table]
        if not read.finishing:
            piece = (table.generation, table.durable)
            assert piece not in table.read_chunks, f"chunk {piece} read again"
            table.read_chunks.add(piece)
            table.durable += 1
            read.finishing = table.durable >= table.chunks
            return
        reached = self.core.stream_reached(Lsn(read.end), Lsn(self.server_end), self.pending, self.now)
        if reached.done:
            assert self.server_end >= read.end and not self.pending, "a read ended before the stream reached its end"
            self.reads.remove(read)
            self.stopped.add(read.handle)
            table.done, table.wanted = True, False
        else:  # the server is asked where its WAL ends only while the stream is short of the read's end
            assert reached.want_end == (read.end if self.server_end < read.end else None)

    # -- events --------------------------------------------------------------------------------------

    def truncate(self, index: int) -> None:
        reads = [read for read in self.reads if read.table == index]
        for handle in self.core.truncated(self.facts(reads)):
            self.abandon(self.read_of(handle))

    def reshape(self, index: int) -> None:
        reads = [read for read in self.reads if read.table == index]
        if not reads:
            return
        stop_later, over = self.core.reshaped(self.facts(reads))
        for handle in over:
            self.abandon(self.read_of(handle))
        for handle in stop_later:  # after the group: the partial read writes what it held and goes on
            self.carry_out(StopPartial(handle))

    def abandon(self, read: Read) -> None:
        read.abandoned = True
        self.reads.remove(read)
        self.stopped.add(read.handle)
        table = self.tables[read.table]
        self.start_over(table)
        table.wanted = not table.cancelled

    def reconnect(self) -> None:
        self.waiting.clear()
        for read in list(self.reads):
            self.carry_out(self.core.stop(self.facts([read])[0], session_ended=True))

    def kill(self) -> None:
        """Everything in memory is lost; the log keeps each read by key's durable chunks."""
        self.core = SchedulerCore(self.concurrency, RENEW, LOCK_CHECK)
        self.stopped |= {read.handle for read in self.reads}
        self.reads.clear()
        self.waiting.clear()
        for table in self.tables:
            if not table.keyed and not table.done:
                self.start_over(table)
            table.wanted = not table.done and not table.cancelled

    def cancel(self, index: int) -> None:
        table = self.tables[index]
        for read in [read for read in self.reads if read.table == index]:
            self.reads.remove(read)
            self.stopped.add(read.handle)
        self.waiting = [entry for entry in self.waiting if entry[0] != index]
        table.cancelled, table.wanted = True, False

    def check(self) -> None:
        assert len(self.reads) + len(self.waiting) <= self.concurrency, "more reads than the room allows"
        assert len({read.table for read in self.reads}) == len(self.reads), "a table read twice at once"


tables_strategy = st.lists(
    st.builds(Table, chunks=st.integers(1, 12), keyed=st.booleans(), partial=st.sampled_from([False, False, False, True])),
    min_size=1,
    max_size=TABLES,
)
step_strategy = st.one_of(
    st.tuples(st.just("pass"), st.floats(0.0, 3.0), st.integers(0, 7)),
    st.tuples(st.just("pass"), st.floats(0.0, 0.5), st.just(0)),
    st.tuples(st.just("discover"), st.none(), st.none()),
    st.tuples(st.just("stream"), st.integers(0, 12), st.booleans()),
    st.tuples(st.just("stream"), st.integers(5, 12), st.just(False)),
    st.tuples(st.just("truncate"), st.integers(0, TABLES - 1), st.none()),
    st.tuples(st.just("ddl"), st.integers(0, TABLES - 1), st.none()),
    st.tuples(st.just("reconnect"), st.none(), st.none()),
    st.tuples(st.just("kill"), st.none(), st.none()),
    st.tuples(st.just("cancel"), st.integers(0, TABLES - 1), st.none()),
)


def _apply(world: World, step: tuple[str, object, object]) -> None:
    kind, a, b = step
    if kind == "pass":
        assert isinstance(a, float) and isinstance(b, int)
        world.one_pass(a, b)
    elif kind == "discover":
        world.discover()
        world.stream(1, world.pending)
    elif kind == "stream":
        assert isinstance(a, int) and isinstance(b, bool)
        world.stream(a, b)
    elif kind in ("truncate", "ddl", "cancel"):
        assert isinstance(a, int)  # mostly a table being read
        reading = [read.table for read in world.reads]
        index = reading[a % len(reading)] if reading and a < TABLES - 1 else a % len(world.tables)
        {"truncate": world.truncate, "ddl": world.reshape, "cancel": world.cancel}[kind](index)
    elif kind == "reconnect":
        world.reconnect()
    else:
        world.kill()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables=tables_strategy, concurrency=st.integers(1, 3), steps=st.lists(step_strategy, min_size=10, max_size=120))
def test_reads_keep_their_rules_over_random_interleavings(
    tables: list[Table], concurrency: int, steps: list[tuple[str, object, object]]
) -> None:
    for table in tables:  # a partial read is read by key (the model's block-range reads are whole)
        table.keyed = table.keyed or table.partial
    world = World(tables, concurrency)
    for step in steps:
        _apply(world, step)
        world.check()
    # events stop: the stream moves on with nothing pending, passes go by, discoveries when due
    world.pending = False
    for _ in range(400):
        world.stream(1, False)
        world.discover()
        world.one_pass(0.05, 0)
        world.check()
        if all(table.done or table.cancelled for table in world.tables):
            break
    assert all(table.done or table.cancelled for table in world.tables), "a wanted table was never read"


def test_room_counts_reads_under_way_and_snapshots_waiting() -> None:
    core = SchedulerCore(3, RENEW, LOCK_CHECK)
    assert core.room(1, 1) == 1
    assert not core.wants_discovery(True, 2, 1)
    assert core.wants_discovery(True, 1, 1)
    core.resume_due = True
    assert core.wants_discovery(False, 3, 0)
    core.discovered()
    assert not core.wants_discovery(False, 0, 0)


def test_locks_are_looked_for_at_most_every_interval() -> None:
    core = SchedulerCore(1, RENEW, LOCK_CHECK)
    assert core.lock_check_due(10.0)
    assert not core.lock_check_due(10.0 + LOCK_CHECK / 2)
    assert core.lock_check_due(10.0 + LOCK_CHECK)


def test_a_reads_end_asks_the_server_to_flush_after_half_a_second_at_most_once_a_second() -> None:
    core = SchedulerCore(1, RENEW, LOCK_CHECK)
    end = Lsn(200)
    assert core.stream_reached(end, Lsn(100), False, 0.0) == Reached(done=False, want_end=end, nudge=False)
    nudges = [core.stream_reached(end, Lsn(100), False, t / 10).nudge for t in range(1, 30)]
    assert [t / 10 for t, nudge in zip(range(1, 30), nudges) if nudge] == [0.5, 1.5, 2.5]
    assert not core.stream_reached(end, Lsn(200), True, 3.0).done  # received, not yet appended
    assert core.stream_reached(end, Lsn(200), False, 3.0).done


def test_a_read_stops_by_its_kind() -> None:
    core = SchedulerCore(1, RENEW, LOCK_CHECK)

    def facts(partial: bool, resumable: bool) -> ReadFacts:
        return ReadFacts(1, partial=partial, resumable=resumable, finishing=False, abandoned=False, started=0.0)

    assert core.stop(facts(False, True)) == Suspend(1)
    assert core.stop(facts(False, False)) == StartOver(1)
    assert core.stop(facts(False, False), session_ended=True) == End(1)
    assert core.stop(facts(True, True), session_ended=True) == StopPartial(1, park=True)
    assert core.renewals([facts(False, False), facts(False, True)], RENEW) == [Suspend(1)]
