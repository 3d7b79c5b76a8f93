"""Read an offline wandb run back from disk: the `.wandb` transaction log and the table files.

The `.wandb` file is a leveldb-style log: a 7-byte file header (`:W&B`, magic 0xBEE1, version), then 32 KiB
blocks of records, each with a 7-byte header (crc32 4 bytes, length 2 bytes, type 1 byte, little-endian).
A record that does not fit its block is split into FIRST / MIDDLE* / LAST pieces; a block's last < 7 bytes are
zero padding. Each whole record is a serialized `wandb.proto.wandb_internal_pb2.Record`."""
from __future__ import annotations
import json, struct, time, zlib
from pathlib import Path
import pandas as pd

BLOCK,HEADER = 32768,7
FULL,FIRST,MIDDLE,LAST = 1,2,3,4
FILE_IDENT,FILE_MAGIC = b':W&B',0xBEE1


def read_raw_records(path) -> list[bytes]:
    "The payloads of every record in the leveldb-style log at `path`, with checksums verified"
    data = Path(path).read_bytes()
    ident,magic,version = struct.unpack('<4sHB', data[:HEADER])
    if ident != FILE_IDENT or magic != FILE_MAGIC: raise ValueError(f"{path} is not a .wandb file (header {data[:HEADER]!r})")
    out,pending,pos = [],None,HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER: pos += left; continue  # block trailer
        crc,n,typ = struct.unpack('<IHB', data[pos:pos+HEADER])
        if crc == 0 and n == 0 and typ == 0: break  # zero-filled tail
        payload = data[pos+HEADER:pos+HEADER+n]
        if len(payload) < n: break  # torn write at the end
        if zlib.crc32(payload, zlib.crc32(bytes([typ]))) & 0xffffffff != crc:
            raise ValueError(f"{path}: bad checksum at byte {pos}")
        pos += HEADER + n
        if typ == FULL: out.append(payload)
        elif typ == FIRST: pending = bytearray(payload)
        elif typ == MIDDLE: pending += payload
        elif typ == LAST: pending += payload; out.append(bytes(pending)); pending = None
        else: raise ValueError(f"{path}: unknown record type {typ} at byte {pos}")
    return out


def read_records(path) -> list:
    "Every `Record` protobuf in the `.wandb` file at `path`, in order"
    from wandb.proto import wandb_internal_pb2 as pb
    recs = []
    for raw in read_raw_records(path):
        r = pb.Record(); r.ParseFromString(raw); recs.append(r)
    return recs


def _key(item):
    "An item's key; a nested key (a logged dict, e.g. a table reference) flattened to `outer/inner`"
    return '/'.join(item.nested_key) if item.nested_key else item.key


def _has_exit(recs): return any(r.WhichOneof('record_type') == 'exit' for r in recs)


class WandbRun:
    "An offline run read back: `history` (one dict per logged row, `_step` included), `summary`, `config`, `table(key)`"
    def __init__(self,
        run_dir, # An `offline-run-*` folder
        timeout:float=30., # Seconds to wait for the run's `exit` record: wandb's service may still be writing after `wandb.finish()`
    ):
        self.dir = Path(run_dir)
        files = list(self.dir.glob('*.wandb'))
        if len(files) != 1: raise FileNotFoundError(f"expected one .wandb file in {self.dir}, found {files}")
        deadline = time.monotonic() + timeout
        while True:
            self.records = read_records(files[0])
            if _has_exit(self.records): break
            if time.monotonic() > deadline: raise TimeoutError(f"{files[0]} has no exit record after {timeout} s: the run did not finish")
            time.sleep(0.05)
        self.history,self.summary,self.config = [],{},{}
        for r in self.records:
            kind = r.WhichOneof('record_type')
            if kind == 'history':
                row = {_key(it): json.loads(it.value_json) for it in r.history.item}
                if r.history.HasField('step'): row.setdefault('_step', r.history.step.num)
                self.history.append(row)
            elif kind == 'summary':
                for it in r.summary.update: self.summary[_key(it)] = json.loads(it.value_json)
                for it in r.summary.remove: self.summary.pop(_key(it), None)
            elif kind in ('config','run'):  # config updates, and the config sent with the run record
                for it in (r.config if kind == 'config' else r.run.config).update: self.config[_key(it)] = json.loads(it.value_json)

    def series(self, key) -> list[tuple[int, object]]:
        "`(step, value)` of every history row that logged `key`"
        return [(h['_step'], h[key]) for h in self.history if key in h]

    def keys(self) -> set[str]:
        "Every key logged in the history"
        return {k for h in self.history for k in h}

    def table(self, key) -> pd.DataFrame:
        "The last table logged under `key`, read from its file under `files/`"
        refs = [h[f'{key}/path'] for h in self.history if h.get(f'{key}/_type') == 'table-file']  # nested keys, flattened
        if not refs: raise KeyError(f"no table logged under {key!r}; history keys: {sorted(self.keys())}")
        t = json.loads((self.dir/'files'/refs[-1]).read_text())
        return pd.DataFrame(t['data'], columns=t['columns'])


def find_run(wandb_dir, timeout:float=30.) -> WandbRun:
    "The single offline run under `wandb_dir` (a `WANDB_DIR`), read once it is completely written"
    runs = sorted(Path(wandb_dir).glob('wandb/offline-run-*'))
    if len(runs) != 1: raise FileNotFoundError(f"expected one offline run under {wandb_dir}, found {runs}")
    return WandbRun(runs[0], timeout)
