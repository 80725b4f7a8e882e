"""The approval console in a real browser: Debian's chromium driven by Playwright, against a
real ``callgate api`` and real workers.

An approver signs in with their key (the key never appears in the page, the session cookie
is HttpOnly and SameSite=Strict), approves the 12,000 KRW refund of order O-17 and sees its
result, sees a request decided elsewhere move without a reload, approves a refund whose
order gets a newer payment meanwhile and reads that a new decision is needed, and denies
the deletion of 50 e-mails. Counted at the downstreams: the approved refunds once each, no
deletion.

``CONSOLE_SCREENSHOT=PATH`` saves a screenshot of the console there as well.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, text

from callgate.ops.lab.demo import downstream
from tests.acceptance import browser
from tests.acceptance.api_server import ApiServer, api, engine, env, make_key, running
from tests.acceptance.conftest import REFUND_O17, effects_for, scalar

__all__ = ["api", "engine", "env", "running"]  # fixtures, for pytest


def _parked(http: httpx.Client, proposals: list[dict[str, Any]]) -> tuple[str, str]:
    """Submit one call that asks for an approval; (turn id, approval id) once parked."""
    turn = http.post("/v1/turns", json=proposals).json()
    for _ in range(12):
        doc = http.get(f"/v1/turns/{turn['turn_id']}/results", params={"wait": 10}).json()
        if doc["awaiting_approval"]:
            return turn["turn_id"], next(iter(doc["awaiting_approval"].values()))
    raise AssertionError(f"the call never parked: {doc}")


def _idempotency_key(engine: Engine, turn_id: str) -> str:
    return str(
        scalar(
            engine,
            "SELECT o.idempotency_key FROM callgate.calls c"
            " JOIN callgate.operations o USING (operation_id) WHERE c.turn_id = :t",
            t=turn_id,
        )
    )


def test_an_approver_signs_in_approves_the_o17_refund_and_denies_a_deletion(
    running: ApiServer, env: dict[str, str], engine: Engine, tmp_path: Path
) -> None:
    browser.require_chromium()
    from playwright.sync_api import expect

    requester = make_key(env, "tenant-a", "user-17", "support")["key"]
    approver = make_key(env, "tenant-a", "user-5", "approver")["key"]
    colleague = make_key(env, "tenant-a", "user-9", "approver")["key"]
    other_order, moved_order = (f"O-{uuid.uuid4().hex[:8]}" for _ in range(2))
    with engine.begin() as conn:
        for order in (other_order, moved_order):
            downstream.add_payment(
                conn, order, "tenant-a", "merchant-tenant-a", f"pay-{order}", 50_000, "KRW"
            )
    with running.client(requester) as http:
        refund_turn, refund_approval = _parked(
            http, [{"call_id": "r1", "tool_name": "refund_payment", "arguments": REFUND_O17}]
        )
        delete_turn, delete_approval = _parked(
            http,
            [{"call_id": "d1", "tool_name": "delete_emails", "arguments": {"query": "Policy"}}],
        )
        _elsewhere_turn, elsewhere_approval = _parked(
            http,
            [
                {
                    "call_id": "e1",
                    "tool_name": "refund_payment",
                    "arguments": {"order_id": other_order, "amount": 20_000, "currency": "KRW"},
                }
            ],
        )
        _moved_turn, moved_approval = _parked(
            http,
            [
                {
                    "call_id": "m1",
                    "tool_name": "refund_payment",
                    "arguments": {"order_id": moved_order, "amount": 30_000, "currency": "KRW"},
                }
            ],
        )

    with browser.page(1100, 1300) as page:
        page.goto(f"{running.url}/console")
        page.fill("#key", approver)
        page.click("#sign-in button[type=submit]")
        expect(page.locator("#who")).to_have_text("user-5 · tenant-a")
        expect(page.locator("#sign-in")).to_be_hidden()
        pending = page.locator("#pending article[data-state=pending]")
        expect(pending).to_have_count(4)

        # The key is nowhere in the page, and the session cookie holds no secret.
        assert approver not in page.content()
        assert page.input_value("#key") == ""
        (cookie,) = page.context.cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert approver.rsplit(".", 1)[1] not in cookie["value"]

        # The server-computed impact of the O-17 refund.
        refund_card = page.locator(f"article[data-approval='{refund_approval}']")
        expect(refund_card).to_contain_text("refund_payment")
        expect(refund_card).to_contain_text("order_id O-17")
        expect(refund_card).to_contain_text("12,000 KRW")
        expect(refund_card).to_contain_text("irreversible")
        expect(refund_card).to_contain_text("user-17")
        delete_card = page.locator(f"article[data-approval='{delete_approval}']")
        expect(delete_card).to_contain_text("50 item(s)")

        refund_card.get_by_role("button", name="Approve").click()
        decided = page.locator(f"#recent article[data-approval='{refund_approval}']")
        expect(decided).to_have_attribute("data-state", "approved")
        expect(decided).to_contain_text("r1: succeeded")  # the refund ran: its result
        expect(decided).to_contain_text('"amount":12000')

        # Decided elsewhere (another approver, over the API): the page follows by itself.
        with running.client(colleague) as http:
            assert http.post(f"/v1/approvals/{elsewhere_approval}/approve").status_code == 200
        expect(
            page.locator(f"#recent article[data-approval='{elsewhere_approval}']")
        ).to_have_attribute("data-state", "approved")

        # The order gets a newer payment while its refund waits: approving it now, the
        # resumed call resolves another payment (another intent). The approval does not
        # carry over; the console says so on the new request.
        with engine.begin() as conn:
            downstream.add_payment(
                conn, moved_order, "tenant-a", "merchant-tenant-a", "pay-newer", 50_000, "KRW"
            )
        page.locator(f"article[data-approval='{moved_approval}']").get_by_role(
            "button", name="Approve"
        ).click()
        superseded = page.locator(f"#recent article[data-approval='{moved_approval}']")
        expect(superseded).to_have_attribute("data-state", "superseded")
        expect(superseded).to_contain_text("Superseded by version 2")
        again = pending.filter(has_text="payment_id pay-newer")
        expect(again).to_contain_text(
            "The intent changed after version 1 was decided by user-5: that decision does "
            "not carry over. This is a new request and needs a new decision."
        )

        shot = tmp_path / "console.png"
        page.screenshot(path=str(shot), full_page=True)
        if target := os.environ.get("CONSOLE_SCREENSHOT"):
            shutil.copyfile(shot, target)

        delete_card.get_by_role("button", name="Deny").click()
        denied = page.locator(f"#recent article[data-approval='{delete_approval}']")
        expect(denied).to_have_attribute("data-state", "denied")
        expect(denied).to_contain_text("approval_denied")
        again.get_by_role("button", name="Deny").click()
        expect(pending).to_have_count(0)

        # A forged decision without the CSRF token changes nothing.
        status = page.evaluate(
            "async (id) => (await fetch(`/console/approvals/${id}/approve`,"
            " {method: 'POST'})).status",
            delete_approval,
        )
        assert status == 403

    refund_key = _idempotency_key(engine, refund_turn)
    assert effects_for(engine, refund_key) == 1
    with engine.connect() as conn:
        deleted = conn.execute(
            text("SELECT count(*) FROM downstream.side_effects WHERE idempotency_key = :k"),
            {"k": _idempotency_key(engine, delete_turn)},
        ).scalar()
    assert deleted == 0
