"""Chat presentation and conversation shared by every chat transport (Telegram, Slack); no network here.

What is shared (transport-neutral):
- `chat.model`: `ChatMessage` (title, Markdown body, one-line status, button rows, picture,
  document, silent) and `Button` (label + token).
- `chat.incident_view`: notifications -> messages: the incident's own message (kept current:
  `incident_message`), replies (`reply_message`), reports/notices (`report_message`, long ones
  as a .md `Document` with a summary).
- `chat.buttons`: tokens `<action>:<incident token>` (the incident's SQLite rowid; <= 64 bytes),
  the keyboard an incident shows in its state (`decode` rejects forged data), and `BUTTONS`,
  one spec per action with its press handler.
- `chat.commands`: `COMMANDS`, one spec per command (its arguments with their validators, its
  handler: an answer, or the work of a long command), and the parser; `chat.router.ChatRouter`:
  authorization (`chat.auth.Authorizer`: allowed chats AND users, operators for scancel),
  short answers, long commands ("working…" then an edit; one per chat, bounded queue,
  timeout) and button presses, looked up in those tables. Handlers reach the daemon through
  `chat.ports` (`ChatBackend`, `Worker`: service/chat_backend.py implements them).
- `chat.routes`: destination by kind/severity/owner (first match, else the default) and
  silence (info always; below critical in quiet hours).
- `alerts.messages.MessageStore`: where each notification landed (incident message = role
  "parent", with its open body in `extra["body"]`; replies; transport data in `extra`).
- Pictures: `Notification.plot` carries inputs; the transport calls the injected
  `render_plot(payload) -> PNG | None` (service/plots_bridge.py) at send time.

What a transport implements — the `notifiers.base.ChatTransport` protocol (notifiers/telegram.py
is the reference; the runner wires every notifier that satisfies it):
1. The `Notifier` protocol (`name`, `render`, `async send`) for outbox deliveries, per event:
   open -> post `incident_message(n, n.body, token=messages.incident_token(...))` to
   `destination_for(n, routes, default)` (photo + caption when a picture renders), then
   `messages.record(role="parent", extra={"body": n.body, ...})`; skip when
   `messages.sent(n.id, name)` already has the parent (a retry after a crash).
   remind/resolve -> reply under every parent (`messages.parents`) + edit the parent;
   update -> edit the parents; report -> reply under the job's newest parent per destination
   (`messages.job_parents`), else post to the route; notice -> post to the route.
   Edits render `incident_message(n, parent.extra["body"], ...)` from the notification's
   incident snapshot, so a restart edits with the right text. "Not modified" is success.
   Record every posted part before returning; raise `NotifierError` (retry_after for rate
   limits, permanent=True for content the API rejects) and let the dispatcher retry.
2. `auth` (an `Authorizer` from its config section: allowed chats/channels AND users,
   operators), `bind(MessageStore)`, `router` (a `ChatRouter` set by the runner), `render_plot`, and
   `async start()` / `async stop()` (a lifecycle step: connect in the background, never fail
   start-up because the chat service is unreachable; stop in reverse order).
3. Intake: translate a command into `router.on_command(text, conversation)` and a button
   press into `router.on_press(token, press_conversation)`; the conversation objects
   implement `chat.ports.Conversation` (sender, send -> handle, edit) and
   `PressConversation` (+ toast, set_buttons). Ack transport deadlines (Slack's 3 s) before
   calling the router: long commands return after "working…" and finish in a task.
4. `async check(text) -> list[CheckResult]` for `jobdiagd notify-test`: name bad tokens,
   unknown destinations and missing permissions.
"""
