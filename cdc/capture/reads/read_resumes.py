"""Reads across sessions and runs: the reads an earlier run left under way found again and resumed past
their last durable key, the partial reads a session stopped written out, and the holding files of reads
that are over deleted (:meth:`ReadResumes.reopen_reads`, :meth:`ReadResumes.flush_parked`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from cdc.capture.reads.held_changes import HeldChanges
from cdc.capture.reads.online_read import held_path
from cdc.capture.reads.partial_reads import flush_records, going_on
from cdc.capture.reads.read_stops import ReadStops
from cdc.capture.table_snapshots import PartialRead, ReadProgress
from log_store import ProducerRecord

log = logging.getLogger("cdc.capture")


class ReadResumes(ReadStops):
    """Reads that outlive a session or a run: kept, resumed, written out or forgotten."""

    def reopen_reads(self) -> None:
        """Find the reads an earlier run left under way (a progress record in the ledger and its holding
        file): their held changes are kept (cut to the log's position) and the gate holds their tables'
        changes from their first boundary on, until a new snapshot resumes them. Other holding files of
        this slot are deleted (their reads start over). A partial read's held changes go to the log now,
        and it goes on as a new partial read (:mod:`cdc.capture.reads.partial_reads`). A read ``cdc snapshot``
        asked for that has not ended (the ledger's note of it) is asked for again."""
        assert self.groups is not None
        assert self.log is not None
        held_dir = self.settings.data_dir / "held"
        kept: set[Path] = set()
        gone = []
        for name, progress in list(self.ledger.reads.items()):
            path = held_path(held_dir, self.settings.slot, progress.relid)
            if progress.relid in self.resumes:
                continue
            if progress.condition is not None:
                self._flush_held(name, progress, path)
                continue
            if not path.exists():
                gone.append(self.ledger.progress_gone(name))
                continue
            held = HeldChanges.reopen(path, self.position, next_run=len(progress.earlier) + 1)
            if held.truncated:  # the read starts over (start_truncated_over)
                held.discard()
                gone.append(self.ledger.progress_gone(name))
                continue
            held.remember(progress.snapshots, progress.caps)
            kept.add(path)
            self.resumes[progress.relid] = (progress, held)
            self.gate.holds[progress.relid] = progress.boundary
            self.groups.held[progress.topic] = held
            log.info("resuming the read of %s after %d rows", progress.topic, progress.rows)
        for path in held_dir.glob(f"{self.settings.slot}-*.held") if held_dir.exists() else ():
            if path not in kept:
                path.unlink(missing_ok=True)
        if gone:
            self.log.append_group(gone, self.position.hex16())
        for name, where in self.ledger.asked:  # asked for by `cdc snapshot`, not ended
            if where is None:
                self.ledger.read_again(name)
            elif not self.partial.holds(name, where):  # (the read that goes on from its progress is that one)
                self.partial.ask(name, PartialRead(where))

    def _flush_held(self, name: str, progress: ReadProgress, path: Path) -> None:
        """A partial read an earlier run or session left (its progress record, its holding file at ``path``):
        its held changes go to the log now, and it goes on past its last key (:mod:`cdc.capture.reads.partial_reads`)."""
        assert self.log is not None and progress.condition is not None
        held = HeldChanges.reopen(path, self.position) if path.exists() else HeldChanges(path)
        self.log.append_group(flush_records(held, self.ledger, name, self.position), self.position.hex16())
        held.discard()
        self.partial.first(name, going_on(progress, progress.condition, progress.rows))
        log.info("the partial read of %s goes on after %d rows", progress.topic, progress.rows)

    def flush_parked(self) -> None:
        """The partial reads the last session stopped: their held changes go to the log, before any group of
        this session, and they go on (:meth:`_flush_held`)."""
        parked, self._parked = self._parked, []
        for read, progress in parked:
            self._flush_held(read.shape.log_name, progress or read.initial_progress(), read.held.path)

    def close_resumes(self) -> None:
        """Close the holding files of reads not finished: the next run resumes them (:meth:`reopen_reads`)."""
        for _, held in self.resumes.values():
            held.close()
        self.resumes.clear()

    def end_reads(self) -> list[ProducerRecord]:
        """The log goes on past a gap (:func:`~cdc.capture.initial_snapshot.begin_again`): the reads an earlier run
        left under way are over (their held changes are older than the gap); the tombstones of their
        progress records, to append with the move. Call :meth:`drop_holding_files` once they are durable."""
        return [self.ledger.progress_gone(name) for name in list(self.ledger.reads)]

    def drop_holding_files(self) -> None:
        """Delete this slot's holding files (the reads they served are over)."""
        held_dir = self.settings.data_dir / "held"
        for path in held_dir.glob(f"{self.settings.slot}-*.held") if held_dir.exists() else ():
            path.unlink(missing_ok=True)

    def _drop_resumes_left_out(self) -> None:
        """Reads to resume whose table capture no longer takes (it left the publication or ``CDC_TABLES``)
        are over: their holding files go, and their progress records get tombstones, so that
        ``cdc snapshot --status`` and ``cdc lag`` stop listing them."""
        assert self.log is not None and self.groups is not None
        taken = {t.relid for t in self.catalog.published_tables(self.settings.publication) if self.include(t.schema, t.table)}
        records: list[ProducerRecord] = []
        for relid in [relid for relid in self.resumes if relid not in taken]:
            progress, held = self.resumes.pop(relid)
            self.groups.held.pop(progress.topic, None)
            self.gate.holds.pop(relid, None)
            held.discard()
            name = next((name for name, read in self.ledger.reads.items() if read.relid == relid), None)
            if name is not None:
                records.append(self.ledger.progress_gone(name))
            log.info("the read of %s is over: its table is no longer captured", progress.topic)
        if records:
            self.log.append_group(records, self.position.hex16())
