"""The node's own receipt log stays bounded on disk: rotated once past its cap."""

import json

from echo_node.config import NodeConfig
from echo_node.receipts import save_receipt
from protocol import codec
from protocol.wire.rollout import Receipt
from tests.protocol.samples import all_messages


def test_receipts_file_is_rotated_past_its_cap(tmp_path):
    receipt = next(m for m in all_messages() if isinstance(m, Receipt))
    config = NodeConfig(data_dir=tmp_path, receipts_max_mb=0.01)  # ~10 KiB
    for _ in range(100):
        save_receipt(config.receipts_path, receipt, config.receipts_max_mb)
    current, rotated = config.receipts_path, tmp_path / "receipts.jsonl.1"
    assert rotated.exists()
    line = len(current.read_text().splitlines()[0]) + 1
    for path in (current, rotated):
        assert path.stat().st_size <= 0.01 * 2**20 + line
        for text in path.read_text().splitlines():  # whole lines only, each a receipt
            assert codec.decode(bytes.fromhex(json.loads(text)["receipt"]), Receipt) == receipt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["receipts.jsonl", "receipts.jsonl.1"]
