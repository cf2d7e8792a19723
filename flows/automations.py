"""Create the Prefect automations shipped in deployments/prefect/automations/.

    uv run python -m flows.automations --webhook-url https://hooks.example.com/...
    uv run python -m flows.automations --block slack-webhook/ops-alerts

Why a command of ours and not `prefect automation create -f`: a
`send-notification` action names its notification block by id, and the id
exists only once the block is saved on that server. Our files name the block
as `block:<block-type-slug>/<name>` instead; this command saves the webhook
block when given `--webhook-url`, resolves every such reference, and creates
each automation, replacing one of the same name (so it can be run again).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Final, cast
from uuid import UUID

import yaml
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.events.schemas.automations import AutomationCore

AUTOMATIONS_DIR: Final = Path(__file__).resolve().parents[1] / "deployments" / "prefect" / "automations"
BLOCK_REFERENCE: Final = "block:"
DEFAULT_BLOCK: Final = "custom-webhook/storage-migrator-alerts"


class AutomationFileError(ValueError):
    """An automation file we cannot create (names the file and the fix)."""


def save_webhook_block(url: str, *, name: str = DEFAULT_BLOCK.split("/", 1)[1]) -> UUID:
    """The JSON webhook the shipped automations notify through: `{"subject": ..., "body": ...}`."""
    block = CustomWebhookNotificationBlock.model_validate(
        {"name": name, "url": url, "json_data": {"subject": "{{subject}}", "body": "{{body}}"}}
    )
    return cast(UUID, block.save(name, overwrite=True))


def _resolve(client: SyncPrefectClient, reference: str, *, path: Path, default: str | None) -> str:
    slug_name = reference.removeprefix(BLOCK_REFERENCE)
    if default is not None and slug_name == DEFAULT_BLOCK:
        slug_name = default
    slug, _, name = slug_name.partition("/")
    if not slug or not name:
        raise AutomationFileError(f"{path}: {reference!r} is not block:<block-type-slug>/<name>")
    try:
        return str(client.read_block_document_by_name(name=name, block_type_slug=slug).id)
    except Exception as exc:  # ObjectNotFound, and a wrong slug answers 404 too
        raise AutomationFileError(
            f"{path}: notification block {slug}/{name} not found on this Prefect server: create it "
            f"(--webhook-url URL saves {DEFAULT_BLOCK}) or pass --block <block-type-slug>/<name>"
        ) from exc


def load_automation(client: SyncPrefectClient, path: Path, *, block: str | None = None) -> AutomationCore:
    """One automation file with its `block:` references resolved to block document ids."""
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    for action in data.get("actions", []):
        ref = action.get("block_document_id")
        if isinstance(ref, str) and ref.startswith(BLOCK_REFERENCE):
            action["block_document_id"] = _resolve(client, ref, path=path, default=block)
    try:
        return AutomationCore.model_validate(data)
    except ValueError as exc:
        raise AutomationFileError(f"{path}: not a valid Prefect automation: {exc}") from exc


def create_automations(paths: list[Path], *, block: str | None = None) -> list[UUID]:
    """Create each automation, replacing those of the same name; returns their ids."""
    created = []
    with get_client(sync_client=True) as client:
        for path in paths:
            automation = load_automation(client, path, block=block)
            for old in client.read_automations_by_name(automation.name):
                client.delete_automation(old.id)
            created.append(client.create_automation(automation))
    return created


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.automations", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="automation files (default: all shipped ones)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--webhook-url", help=f"save the JSON webhook block {DEFAULT_BLOCK} pointing here")
    source.add_argument("--block", help="notify through this existing block instead: <block-type-slug>/<name>")
    args = parser.parse_args(argv)
    paths = args.files or sorted(AUTOMATIONS_DIR.glob("*.yaml"))
    if args.webhook_url:
        save_webhook_block(args.webhook_url)
    try:
        ids = create_automations(paths, block=args.block)
    except AutomationFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path, automation_id in zip(paths, ids, strict=True):
        print(f"created automation {automation_id} from {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
