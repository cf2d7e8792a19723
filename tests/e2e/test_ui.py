"""What operators see in the Prefect UI (issue 23), read in a real browser.

A headless Chromium (Debian's `chromium`, driven by Playwright: sim/devstack/browser.py)
opens the UI of the e2e tier's shared server (tests/e2e/conftest.py) after the
project's deployments ran on it: a migration that succeeds, one that fails on an
object a webhook rejects, and a guided key rotation that pauses for its form. Each
test asserts on text visible on a page, as a person reads it; the UI is a
single-page app that loads its data after it renders, so every wait is for text,
with generous timeouts, never for time. The server asks for its auth string (issue 30):
the browser enters it in the UI's login form once, as an operator does, and the first
test shows the form, a wrong string refused and the right one let in.

On failure the page is saved as a screenshot under `test-artifacts/ui/` (the path
is printed). `UI_SCREENSHOTS_DIR=docs/img` also saves the pages that
docs/ui.md shows (scripts/ui-screenshots.sh).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from playwright.sync_api import Browser, BrowserContext, Locator, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from devstack import REPO, PrefectStack
from devstack.browser import LOGIN_PLACEHOLDER, chromium_executable, headless_chromium, log_in, new_context
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.requests import read_migration
from storage_migrator.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("migration_crds"), pytest.mark.timeout(600)]

#: Seconds a page may take to show a text: three pytest sessions share 2 cores in CI.
PAGE_SECONDS = 90
#: Seconds for the runs the fixture starts to end (or pause): a worker picks a run up
#: every 2 s, and a flow run's process takes 10-30 s to start on a loaded machine.
RUN_SECONDS = 300
ARTIFACTS = REPO / "test-artifacts" / "ui"
DOC_SCREENSHOTS = os.environ.get("UI_SCREENSHOTS_DIR")
CONFIGMAPS = 12
SECRETS = 4
RUNBOOK_KEY = "key9"


@dataclass(frozen=True)
class MigrationRun:
    """A migration's flow run as the API knows it, and its counters as its request recorded them."""

    flow_run_id: str
    name: str
    migration: str
    resource: str
    counters: dict[str, int]
    message: str


@dataclass(frozen=True)
class Started:
    """The runs the fixture started on the shared server (they may still be running)."""

    stack: PrefectStack
    migrations: dict[str, str]  # resource -> flow run id
    runbook_id: str
    rejected: str  # <namespace>/<name> of the Secret the webhook rejects
    sentinel: str  # the rejected Secret's content (and the webhook's message quotes it)


@dataclass(frozen=True)
class Ran:
    """The migrations' runs once they ended, for the pages to show."""

    stack: PrefectStack
    succeeded: MigrationRun
    failed: MigrationRun
    rejected: str
    sentinel: str


def start(stack: PrefectStack, *runs: tuple[str, dict[str, Any]]) -> list[str]:
    """`prefect deployment run DEPLOYMENT -p ...` for each (deployment, parameters), through the
    client (a CLI process costs seconds); the runs' ids."""
    with stack.client() as client:
        return [str(client.create_flow_run_from_deployment(client.read_deployment_by_name(name).id,
                                                           parameters=parameters).id)
                for name, parameters in runs]  # fmt: skip


def _ended(stack: PrefectStack, run_id: str) -> Any:
    """The flow run once it has ended or paused, else None."""
    with stack.client() as client:
        run = client.read_flow_run(UUID(run_id))
    return run if run.state and (run.state.is_final() or run.state.is_paused()) else None


def _migration_run(stack: PrefectStack, ours: Any, run_id: str) -> MigrationRun:
    """A `migrate-resource` run once it ended: its request is the one its `migration:` tag names."""
    run = wait_until(lambda: _ended(stack, run_id), timeout=RUN_SECONDS, what=f"the flow run {run_id} to end",
                     seen=lambda: runs_seen(stack))  # fmt: skip
    tags = [t.removeprefix("migration:") for t in run.tags if t.startswith("migration:")]
    assert len(tags) == 1, f"{run.name} is tagged {run.tags}"
    migration = read_migration(ours, tags[0])
    progress = migration.status.progress
    counters = progress.model_dump(exclude={"remaining_item_count"}) if progress else {}
    return MigrationRun(flow_run_id=run_id, name=run.name, migration=tags[0],
                        resource=migration.spec.resource.resource, counters=counters,
                        message=run.state.message or "")  # fmt: skip


def wait_until(predicate: Callable[[], Any], *, what: str, timeout: float, seen: Callable[[], str] = str) -> Any:
    """Poll until `predicate` returns something true, 0.1 s after the first try and twice as long
    each time up to a second (the `wait_for` fixture's loop, for a module-scoped fixture);
    `seen()` says what there was instead."""
    deadline = time.monotonic() + timeout
    pause = 0.1
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(pause)
        pause = min(1.0, pause * 2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}: {seen()}")


def runs_seen(stack: PrefectStack) -> str:
    with stack.client() as client:
        runs = client.read_flow_runs(limit=50)
    return "; ".join(f"{r.name} {r.state.name if r.state else '?'}" for r in runs)


def _restore(admin: Any, before: dict[str, Any]) -> None:
    """kubesim's admin settings as they were (what the `kubesim` fixture does after each test)."""
    admin.clear_faults()
    admin.set_feature_gates(before["featureGates"])
    admin.set_encryption(before["encryption"]["keys"], resources=before["encryption"]["resources"])
    for group_resource, version in before["storageVersions"].items():
        resource, _, group = group_resource.partition(".")
        admin.set_storage_version(resource, version, group=group)


@pytest.fixture(scope="module")
def started(deployed_stack: PrefectStack, kubesim_session: Any) -> Iterator[Started]:
    """ConfigMaps stored as v2 and Secrets under a new write key, each migrated through the
    `migrate-resource` deployment: the ConfigMaps' run will succeed; the Secrets' will fail
    on one Secret a webhook rejects with a message that quotes its content. And a guided key
    rotation (`key-rotation-runbook`) that will pause at its first form.

    The pages that need no run are read while these run (`ran` waits for them)."""
    stack, admin = deployed_stack, kubesim_session.admin
    api = k8s_config.new_client_from_config(config_file=kubesim_session.kubeconfig)
    core = k8s.CoreV1Api(api)
    namespace, sentinel = f"ui-{uuid.uuid4().hex[:8]}", f"ui-sentinel-{uuid.uuid4().hex}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    before = admin.config()
    try:
        for i in range(CONFIGMAPS):
            core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(
                metadata=k8s.V1ObjectMeta(name=f"settings-{i}"), data={"key": f"value-{i}"}))  # fmt: skip
        for i in range(SECRETS):
            core.create_namespaced_secret(namespace, k8s.V1Secret(
                metadata=k8s.V1ObjectMeta(name=f"password-{i}"), string_data={"password": f"{sentinel}-{i}"}))  # fmt: skip
        admin.set_storage_version("configmaps", "v2")
        admin.set_encryption(["key2", "key1"])
        admin.set_faults([{"verb": "patch", "resource": "secrets", "name": "password-1", "code": 422,
                           "message": f"denied by webhook: password {sentinel}-1 is too weak"}])  # fmt: skip
        configmaps, secrets, runbook = start(
            stack,
            ("migrate-resource/migrate-resource", {"resource": "configmaps"}),
            ("migrate-resource/migrate-resource", {"resource": "secrets"}),
            ("key-rotation-runbook/key-rotation-runbook", {"key": RUNBOOK_KEY, "old_key": "key2"}),
        )
        yield Started(stack=stack, migrations={"configmaps": configmaps, "secrets": secrets}, runbook_id=runbook,
                      rejected=f"{namespace}/password-1", sentinel=sentinel)  # fmt: skip
    finally:
        # The paused rotation is left to the stack's end (PrefectStack.stop ends its process).
        _restore(admin, before)
        core.delete_namespace(namespace)
        api.close()


@pytest.fixture(scope="module")
def ran(started: Started, kubesim_session: Any) -> Iterator[Ran]:
    """The migrations' runs once they ended, with the counters their requests recorded."""
    stack = started.stack
    ours = api_client_from_settings(Settings(kubeconfig=kubesim_session.kubeconfig))
    try:
        succeeded, failed = (_migration_run(stack, ours, started.migrations[r]) for r in ("configmaps", "secrets"))
        yield Ran(stack=stack, succeeded=succeeded, failed=failed, rejected=started.rejected,
                  sentinel=started.sentinel)  # fmt: skip
    finally:
        ours.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    if chromium_executable() is None:
        pytest.fail("chromium is not installed: run scripts/bootstrap.sh (it installs Debian's chromium)")
    expect.set_options(timeout=PAGE_SECONDS * 1000)  # assertions wait as long as actions (default 5 s)
    with headless_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def browser(chromium: Browser, deployed_stack: PrefectStack) -> Iterator[BrowserContext]:
    """One browser for the module, as one operator's: the UI's scripts are loaded once, and the
    server's auth string entered once in its login form (both UIs keep it for the address)."""
    context = new_context(chromium, timeout=PAGE_SECONDS)
    page = context.new_page()
    page.goto(deployed_stack.ui_url)
    assert deployed_stack.auth_string, "the e2e server asks for an auth string (issue 30)"
    log_in(page, deployed_stack.auth_string)
    page.close()
    yield context
    context.close()


@pytest.fixture
def page(browser: BrowserContext, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A new tab; a screenshot of it in test-artifacts/ui/ when the test failed."""
    page = browser.new_page()
    try:
        yield page
    finally:
        if any(getattr(request.node, f"rep_{when}", None) and getattr(request.node, f"rep_{when}").failed
               for when in ("setup", "call")):  # fmt: skip
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shot = ARTIFACTS / f"{request.node.name}.png"
            try:
                page.screenshot(path=str(shot))
                print(f"screenshot of {page.url}: {shot}")
            except Exception as exc:  # noqa: BLE001 - evidence is best effort; the failure is reported anyway
                print(f"no screenshot of {page.url}: {exc}")
        page.close()


def document(page: Page, name: str, *, show: Locator | None = None, where: str = "center") -> None:
    """docs/ui.md's screenshot `ui-<name>.png`, when UI_SCREENSHOTS_DIR names a folder;
    `show` is scrolled into the picture (`where`: center, start, end or nearest)."""
    if not DOC_SCREENSHOTS:
        return
    if show is not None:
        show.evaluate("(e, where) => e.scrollIntoView({block: where})", where)
        page.wait_for_timeout(500)  # the scroll settles; only the picture waits on it, no assertion
    folder = Path(DOC_SCREENSHOTS)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"ui-{name}.png"))


def visible(locator: Locator) -> Locator:
    expect(locator).to_be_visible()
    return locator


def text(page: Page, value: str) -> Locator:
    return visible(page.get_by_text(value, exact=True).first)


def card(page: Page, title: str) -> Locator:
    """The card (a run in a list, an artifact) whose title is `title`."""
    return page.locator('[data-slot="card"]').filter(has=page.get_by_text(title, exact=True))


def open_tab(page: Page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()


def no_connection_error(page: Page) -> None:
    """Issue 23: on any port but 4200 every page said this (asked after the page showed API data)."""
    expect(page.get_by_text("Can't connect to Server API")).to_have_count(0)
    expect(page.get_by_text("Something went wrong")).to_have_count(0)


def test_the_ui_asks_for_the_auth_string_and_opens_with_it(deployed_stack: PrefectStack, chromium: Browser) -> None:
    """Issue 30: "the Prefect UI [the demo] prints asks for the string". A first visit (a browser
    of its own) meets the login form instead of the page; a wrong string is refused there; the
    server's string opens the page that was asked for, with the API's data."""
    stack = deployed_stack
    context = new_context(chromium, timeout=PAGE_SECONDS)
    try:
        page = context.new_page()
        page.goto(f"{stack.ui_url}/v2/deployments")
        field = visible(page.get_by_placeholder(LOGIN_PLACEHOLDER))
        expect(page.get_by_text("detect-storage-changes")).to_have_count(0)
        document(page, "login")  # before anything is typed: the string is never in a picture
        field.fill("admin:not-the-string")
        page.get_by_role("button", name="Login").click()
        text(page, "Invalid credentials")
        assert stack.auth_string
        log_in(page, stack.auth_string)
        text(page, "detect-storage-changes")
        expect(page).to_have_url(re.compile(r"/v2/deployments"))
        no_connection_error(page)
    finally:
        context.close()


def test_the_deployments_page_shows_detection_every_ten_minutes(started: Started, page: Page) -> None:
    """Read while the fixture's runs run: it needs none of them."""
    page.goto(f"{started.stack.ui_url}/v2/deployments")
    for name in ("detect-storage-changes", "migrate-resource", "run-migrations", "key-rotation-runbook"):
        text(page, name)
    no_connection_error(page)
    page.get_by_text("detect-storage-changes", exact=True).first.click()
    text(page, "Every 10 minutes")
    text(page, "flows/detect_storage_changes.py:detect_storage_changes")
    document(page, "detection-schedule", show=page.get_by_text("Every 10 minutes", exact=True).first)


def test_a_paused_guided_rotation_shows_its_form(started: Started, page: Page) -> None:
    """The paused rotation's form, as the operator meets it: what to change on every API
    server, and the switch that says it is done (issue 23; the flow: issue 19)."""
    stack = started.stack
    wait_until(lambda: _ended(stack, started.runbook_id), timeout=RUN_SECONDS,
               what="the guided key rotation to pause", seen=lambda: runs_seen(stack))  # fmt: skip
    page.goto(f"{stack.ui_url}/v2/runs/flow-run/{started.runbook_id}")
    text(page, f"key-rotation-runbook-{RUNBOOK_KEY}")
    text(page, "Paused")
    page.get_by_role("button", name="Open menu").first.click()
    page.get_by_role("menuitem", name="Resume").click()
    form = visible(page.get_by_role("dialog"))
    expect(form).to_contain_text(f"Key rotation to {RUNBOOK_KEY}, phase 1 of 5")
    done = form.get_by_label(re.compile(r"^Done on every API server"))
    expect(done).to_have_count(1)
    expect(done).to_have_attribute("aria-checked", "false")  # a switch to turn on
    expect(form).to_contain_text("Tick once every API server runs the changed EncryptionConfiguration.")
    document(page, "runbook-form", show=done, where="nearest")


def test_the_runs_page_lists_migrations_by_name_with_their_resource(ran: Ran, page: Page) -> None:
    page.goto(f"{ran.stack.ui_url}/v2/runs")
    for run, state in ((ran.succeeded, "Completed"), (ran.failed, "Failed")):
        listed = card(page, run.name)
        expect(listed).to_have_count(1)
        expect(listed).to_contain_text(f"resource:{run.resource}")
        expect(listed).to_contain_text(f"migration:{run.migration}")
        expect(listed).to_contain_text("cluster:default")  # issue 20: which cluster, in a fleet's one UI
        expect(listed).to_contain_text(state)
    document(page, "runs", show=card(page, ran.failed.name), where="start")


def test_a_migrations_artifacts_show_its_progress_and_its_counters(ran: Ran, page: Page) -> None:
    run = ran.succeeded
    page.goto(f"{ran.stack.ui_url}/v2/runs/flow-run/{run.flow_run_id}")
    text(page, run.name)
    open_tab(page, "Artifacts")
    progress, table = card(page, f"migration-{run.migration}"), card(page, f"migration-{run.migration}-outcome")
    expect(progress).to_contain_text(re.compile("progress", re.IGNORECASE))
    expect(progress).to_contain_text(f"Migrating configmaps.v1 ({run.migration})")
    expect(table).to_contain_text(re.compile("table", re.IGNORECASE))
    expect(table).to_contain_text("configmaps.v1: Succeeded")
    document(page, "migration-artifacts")
    # The table's latest version holds the run's counters, one row per outcome.
    page.get_by_text(f"migration-{run.migration}-outcome", exact=True).first.click()
    # The title opens the table's page. Until it is there, the first artifact link is the run's
    # page's, the progress artifact's (a clean-clone suite run, 23, opened that one).
    expect(page).to_have_url(re.compile(r"/artifacts/artifact/"))
    outcome_key = page.get_by_role("definition").get_by_text(f"migration-{run.migration}-outcome", exact=True)
    expect(outcome_key.first).to_be_visible()
    page.locator('a[href*="/artifacts/artifact/"]').first.click()
    rows = visible(page.get_by_role("table").first)
    assert run.counters["rewritten"] >= CONFIGMAPS, run.counters
    for outcome, count in run.counters.items():
        row = rows.get_by_role("row").filter(has=page.get_by_role("cell", name=outcome, exact=True))
        expect(row).to_have_count(1)
        expect(row.get_by_role("cell").last).to_have_text(str(count))
    document(page, "outcome-table")


def test_a_failed_migration_names_the_object_without_its_content(ran: Ran, page: Page) -> None:
    run = ran.failed
    assert f"{ran.rejected} (422 Invalid)" in run.message, run.message
    page.goto(f"{ran.stack.ui_url}/v2/runs/flow-run/{run.flow_run_id}")
    text(page, run.name)
    text(page, "Failed")
    open_tab(page, "Details")
    text(page, "State Message")
    message = visible(page.get_by_text(f"{ran.rejected} (422 Invalid)").first)
    expect(message).to_contain_text("could not be rewritten")
    expect(message).to_contain_text("to fix:")
    assert ran.sentinel not in page.content()
    document(page, "failed-migration", show=message)
    open_tab(page, "Logs")
    # Newest first: the run's last lines name the object. The list draws only the rows in view,
    # and the lines above it grew (issue 31: the writers' count healing logs too).
    page.get_by_role("combobox", name="log sort order").click()
    page.get_by_role("option", name="Newest to oldest").click()
    visible(page.get_by_text(f"{ran.rejected} (422 Invalid)").first)
    assert ran.sentinel not in page.content()


def test_history_links_open_the_run_in_the_classic_ui(ran: Ran, page: Page) -> None:
    """`storage-migrator history` links each run as <PREFECT_UI_URL>/runs/flow-run/<id>:
    Prefect (3.8, 3.9) serves that address with its first UI, which must reach the API too."""
    run = ran.failed
    page.goto(f"{ran.stack.ui_url}/runs/flow-run/{run.flow_run_id}")
    text(page, run.name)
    text(page, f"resource:{run.resource}")
    no_connection_error(page)


def test_the_address_the_demo_prints_opens_the_dashboard_with_the_api_s_data(ran: Ran, page: Page) -> None:
    """The server's own address leads to the dashboard, which shows what only the API knows:
    the work pool polled by its worker, and the failed migration's flow among the last day's
    failed runs, which leads to the run.

    The dashboard's "Past day" ends at the start of the current minute (its queries say so):
    a run created in this minute shows after a reload in the next. Hence the last test, and
    reloads for up to two minutes."""
    page.goto(ran.stack.ui_url)
    text(page, "Flow Runs")
    pool = page.locator('[data-slot="card"]').filter(has=page.get_by_text("storage-migrator-local", exact=True)).last
    expect(pool).to_contain_text(re.compile(r"\d+[smh] ago"))  # the worker's last poll
    # Failed runs first, by flow; the flow leads to its runs.
    runs = page.locator('[data-slot="card"]').filter(has=page.get_by_text("Flow Runs", exact=True)).last
    failed = runs.get_by_text("migrate-resource", exact=True).first
    deadline = time.monotonic() + 120
    while True:
        try:
            failed.wait_for(timeout=10_000)
            break
        except PlaywrightTimeoutError:
            if time.monotonic() > deadline:
                raise
            page.reload()
    no_connection_error(page)
    document(page, "dashboard")
    failed.click()
    expect(card(page, ran.failed.name)).to_contain_text("Failed")
