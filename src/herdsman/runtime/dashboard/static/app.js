// herdsman's dashboard: one snapshot of the state, then one per change from a
// server-sent event stream. Times tick locally; nothing polls but an open log.
"use strict";
(function () {
  const csrf = document.querySelector('meta[name="herdsman-csrf"]').content;
  const TERMINAL = new Set(["succeeded", "failed", "cancelled", "lost"]);
  let state = null;        // the latest snapshot's state
  let skew = 0;            // server time minus this browser's
  let stream = null;
  const timelineRuns = new Map();
  let timelineSince = null;
  let logRun = null;       // the run whose log is open
  let logTimer = null;

  // -- helpers -------------------------------------------------------------
  const $ = (id) => document.getElementById(id);
  const now = () => Date.now() / 1000 + skew;

  function el(tag, attrs, ...children) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
      else if (k === "text") n.textContent = v;
      else n.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) if (c !== null && c !== undefined) n.append(c);
    return n;
  }

  function duration(seconds) {
    if (seconds == null || !isFinite(seconds)) return "—";
    seconds = Math.max(0, Math.round(seconds));
    if (seconds < 60) return `${seconds} s`;
    const m = Math.floor(seconds / 60), s = seconds % 60;
    if (m < 60) return `${m} min ${String(s).padStart(2, "0")} s`;
    const h = Math.floor(m / 60);
    return `${h} h ${String(m % 60).padStart(2, "0")} min`;
  }

  function when(t) {
    if (t == null) return "—";
    const d = new Date(t * 1000);
    const today = new Date().toDateString() === d.toDateString();
    return today ? d.toLocaleTimeString() : d.toLocaleString();
  }

  // A cell whose text counts up from `since` every second (data-since).
  function ticking(since, staleAfter) {
    const td = el("td", { "data-since": since, "data-stale": staleAfter || null, class: "mono" });
    tick(td);
    return td;
  }
  function tick(td) {
    const since = Number(td.dataset.since);
    if (!since) { td.textContent = "—"; return; }
    const age = now() - since;
    // Silent too long: said in words as well as in orange.
    const stale = !!td.dataset.stale && age > Number(td.dataset.stale);
    td.textContent = td.dataset.stale ? `${duration(age)} ago${stale ? " (silent)" : ""}` : duration(age);
    td.classList.toggle("stale", stale);
  }
  setInterval(() => document.querySelectorAll("[data-since]").forEach(tick), 1000);

  // A long id (the generated ones are 36 characters) is shown cut; the link's title has it whole.
  function runLink(id) {
    const shown = id.length > 16 ? `${id.slice(0, 12)}…` : id;
    return el("a", { href: `#log/${encodeURIComponent(id)}`, class: "mono", title: id, "aria-label": `run ${id}`, text: shown });
  }
  function statusCell(status) { return el("td", {}, el("span", { class: `status ${status}`, text: status })); }
  // Which control this is, across redraws: its label, else where it links.
  function identity(n) {
    return n.getAttribute("aria-label") || n.getAttribute("href");
  }
  function fill(table, rows, empty) {
    const body = $(table).tBodies[0];
    if (!rows.length) {
      const cols = $(table).tHead.rows[0].cells.length;
      rows = [el("tr", {}, el("td", { colspan: cols, class: "empty", text: empty }))];
    }
    // A redraw from the stream must not take the keyboard's focus away from the
    // control it was on: the same control in the new rows gets it back. Gone (its
    // run ended, its rest is over), the focus goes to the like control now in its
    // place, else to the table's heading, not back to the top of the page.
    const active = document.activeElement;
    const had = body.contains(active) ? identity(active) : null;
    const kind = (n) => `${n.tagName} ${n.textContent}`;
    const alike = (n) => [...body.querySelectorAll("a, button")].filter((m) => kind(m) === kind(n));
    const place = had ? alike(active).indexOf(active) : -1;
    body.replaceChildren(...rows);
    if (had) {
      const controls = [...body.querySelectorAll("a, button")];
      const like = controls.filter((m) => kind(m) === kind(active));
      const again = controls.find((n) => identity(n) === had) || like[Math.min(place, like.length - 1)];
      const heading = $($(table).getAttribute("aria-labelledby"));
      if (again) again.focus();
      else if (heading) { heading.tabIndex = -1; heading.focus(); }
    }
    scrollable(body.closest(".scroll"));
  }
  // A table wider than its box scrolls in it; the keyboard must be able to scroll it too.
  function scrollable(box) {
    if (!box) return;
    const wide = box.scrollWidth > box.clientWidth;
    const table = box.querySelector("table");
    for (const [k, v] of [["tabindex", "0"], ["role", "region"], ["aria-labelledby", table && table.getAttribute("aria-labelledby")]]) {
      if (wide && v) box.setAttribute(k, v); else box.removeAttribute(k);
    }
  }
  function conversationName(r) {
    if (r.conversation == null) return "—";
    return (r.workspace && r.workspace !== "default" ? r.workspace + "/" : "") + r.conversation;
  }
  // A run submitted without a conversation is in no conversation's lane: it waits behind nothing.
  function laneKey(r) {
    return r.conversation == null ? `run ${r.id}` : conversationName(r);
  }

  // The notice and the announcement are live regions: each is written only when
  // what it says changes, so a snapshot that changes nothing there says nothing.
  function notice(message) {
    const n = $("notice");
    if (n.textContent !== (message || "")) n.textContent = message || "";
    n.hidden = !message;
  }
  // What an action did, said once to a screen reader (the page shows it anyway).
  function announce(message) {
    $("announce").textContent = message;
  }
  function setLive(text, on) {
    const live = $("live");
    if (live.textContent !== text) live.textContent = text;
    live.className = `live ${on ? "on" : "off"}`;
  }

  async function act(url, body) {
    notice("");
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json", "x-herdsman-csrf": csrf },
      body: JSON.stringify(body || {}),
    });
    let answer = {};
    try { answer = await response.json(); } catch (e) { answer = {}; }
    if (response.status === 401) { location.reload(); return answer; }
    if (!response.ok && response.status !== 422) notice(answer.error || `${url}: HTTP ${response.status}`);
    answer.httpOk = response.ok;
    return answer;
  }

  function cancelButton(run) {
    return el("button", {
      type: "button", "data-cancel": run.id, "aria-label": `Cancel run ${run.id}`, text: "Cancel",
      onclick: (event) => busy(event.currentTarget, () => cancelRun(run.id)),
    });
  }
  // A button at work is marked busy, not disabled: a disabled button drops the
  // keyboard's focus to the top of the page. A second press meanwhile does nothing.
  async function busy(button, work) {
    if (button.getAttribute("aria-disabled") === "true") return;
    button.setAttribute("aria-disabled", "true");
    try { await work(); } finally { button.removeAttribute("aria-disabled"); }
  }
  async function cancelRun(id) {
    const answer = await act(`/dashboard/runs/${encodeURIComponent(id)}/cancel`);
    if (answer.httpOk) announce(`Run ${id} cancelled.`);
  }

  // An account's state in words: what keeps it from taking runs first, then what warns.
  // `needs_login` and `near_limit_until` are shown when the view has them.
  function accountState(a) {
    const badges = [];
    let text = a.available ? "available" : (a.reason || "unavailable");
    if (a.exhausted_until) text = `resting until ${when(a.exhausted_until)}` + (a.message ? ` — ${a.message}` : "");
    if (a.needs_login) {
      badges.push(["login", "needs login"]);
      text = a.needs_login;
    }
    if (a.near_limit_until && a.near_limit_until > now() && !a.exhausted_until) {
      badges.push(["near", "near limit"]);
      text += ` (near its limit until ${when(a.near_limit_until)})`;
    }
    return { badges, text, blocked: !a.available || !!a.needs_login };
  }
  // A running or queued run's account state, in words after its name (" — needs login").
  function accountMarks(run) {
    if (!state || TERMINAL.has(run.status)) return "";
    const a = state.status.accounts.find((x) => accountKey(x.provider, x.account) === accountKey(run.provider, run.account));
    const marks = a ? accountState(a).badges.map(([, text]) => text) : [];
    return marks.length ? ` — ${marks.join(", ")}` : "";
  }
  function badges(list) {
    return list.map(([cls, text]) => el("span", { class: `badge ${cls}`, text }));
  }
  function accountKey(provider, account) {
    return `${provider}/${account || ""}`;
  }

  // -- views ---------------------------------------------------------------
  function renderOverview() {
    const s = state.status;
    const cards = [
      ["running", `${s.running}${s.limits.global != null ? " / " + s.limits.global : ""}`, "runs (global cap)"],
      ["queued", String(s.queued), s.retrying ? `queued (${s.retrying} waiting to retry, the first at ${when(s.next_retry_at)})` : "queued"],
      ["oldest", s.oldest_queued_age == null ? "—" : duration(s.oldest_queued_age), "oldest wait"],
      ["generation", String(s.generation), "configuration generation"],
      ["admitting", s.admitting ? "yes" : "draining", "taking new runs"],
    ];
    if (s.accounts.length) {
      const ready = s.accounts.filter((a) => !a.retired && !accountState(a).blocked).length;
      const login = s.accounts.filter((a) => a.needs_login).length;
      const near = s.accounts.filter((a) => accountState(a).badges.some(([cls]) => cls === "near")).length;
      const more = [login ? `${login} need${login === 1 ? "s" : ""} login` : "", near ? `${near} near limit` : ""].filter(Boolean);
      cards.push(["accounts", `${ready} / ${s.accounts.filter((a) => !a.retired).length}`,
        "accounts available" + (more.length ? ` (${more.join(", ")})` : "")]);
    }
    $("cards").replaceChildren(...cards.map(([k, v, label]) => el("div", { class: "card", "data-card": k }, el("b", { text: v }), el("span", { text: label }))));

    const providers = Object.keys(state.providers).sort();
    for (const p of Object.keys(s.queued_by_provider)) if (!providers.includes(p)) providers.push(p);
    fill("providers", providers.map((p) => {
      const cap = s.limits.providers[p] ?? (state.providers[p] || {}).concurrency;
      const waiting = s.waiting_for_accounts[p] || (s.waiting_for_provider || {})[p];
      return el("tr", { "data-provider": p },
        el("td", { text: p }),
        el("td", { class: "mono", text: `${s.running_by_provider[p] || 0} / ${cap ?? "—"}` }),
        el("td", { class: "mono", text: String(s.queued_by_provider[p] || 0) + ((s.retrying_by_provider || {})[p] ? ` (${s.retrying_by_provider[p]} retrying)` : "") }),
        el("td", { class: "mono", text: String(s.parked_by_provider[p] || 0) }),
        el("td", { text: waiting ? (waiting.reason || String(waiting)) + (waiting.until ? ` (until ${when(waiting.until)})` : "") : "" }));
    }), "No providers.");

    const accountBadges = new Map(s.accounts.map((a) => [accountKey(a.provider, a.account), accountState(a).badges]));
    fill("running", state.running.map((r) => el("tr", { "data-run": r.id },
      el("td", {}, runLink(r.id)), el("td", { text: r.provider }), el("td", { text: conversationName(r) }),
      el("td", {}, ...badges(accountBadges.get(accountKey(r.provider, r.account)) || []), r.account || "(ambient)"), ticking(r.started_at),
      ticking(r.last_output_at, 300), el("td", { class: "prompt", title: r.prompt || "", text: r.prompt || "" }),
      el("td", {}, cancelButton(r)))), "Nothing is running.");

    // Conversations in the order their first queued run came, each one's runs in order.
    const lanes = new Map();
    for (const r of state.queued) {
      const key = laneKey(r);
      if (!lanes.has(key)) lanes.set(key, []);
      lanes.get(key).push(r);
    }
    const runningIn = new Map(state.running.map((r) => [laneKey(r), r]));
    fill("queued", [...lanes.entries()].flatMap(([key, runs]) => runs.map((r, i) => {
      const place = i + 1;
      // The run it waits for in its conversation: the one running, or the one queued before it.
      const ahead = i > 0 ? runs[i - 1] : runningIn.get(key);
      return el("tr", { "data-run": r.id },
        el("td", { text: place === 1 ? conversationName(r) : "" }), el("td", { text: r.provider }),
        el("td", { class: "mono", text: String(place) }), el("td", {}, runLink(r.id)),
        el("td", { class: "behind" }, ahead ? runLink(ahead.id) : null, ahead ? ` (${ahead.status})` : ""),
        ticking(r.submitted_at), el("td", { class: "prompt", title: r.prompt || "", text: r.prompt || "" }),
        el("td", {}, cancelButton(r)));
    })), "Nothing is queued.");

  }

  function renderAccounts() {
    fill("accounts", state.status.accounts.map((a) => {
      const near = a.budget && a.usage >= 0.8 * a.budget;
      // The server words the usage as `herdsman accounts` does (3.3k tokens of 5.0k, $0.02 of $0.05).
      const usage = a.usage_text;
      const shown = accountState(a);
      const label = a.account || "(ambient)";
      // Ending the rest also clears a needed login: the user says it is logged in again.
      const login = a.needs_login && !a.exhausted_until;
      const end = a.exhausted_until || a.needs_login ? el("button", {
        type: "button", text: login ? "Logged in again" : "End rest",
        "aria-label": login ? `${a.provider}/${label} is logged in again` : `End the rest of ${a.provider}/${label}`,
        onclick: async () => {
          const answer = await act("/dashboard/accounts/end-rest", { provider: a.provider, account: a.account });
          if (answer.httpOk) announce(login ? `${a.provider}/${label} takes runs again.` : `The rest of ${a.provider}/${label} ended.`);
        },
      }) : null;
      return el("tr", { "data-account": accountKey(a.provider, a.account) },
        el("td", { text: a.provider }), el("td", { text: label + (a.retired ? " (removed)" : "") }),
        el("td", { class: "mono", text: String(a.running + (a.running_elsewhere || 0)) }),
        el("td", { class: near ? "mono near" : "mono", text: usage + (near ? " (near the budget)" : "") }),
        el("td", { class: shown.blocked ? "resting" : "" }, ...badges(shown.badges), shown.text), el("td", {}, end));
    }), "No accounts are configured; each provider runs on its ambient login.");
  }

  function renderRecent() {
    fill("recent", state.recent.map((r) => el("tr", { "data-run": r.id },
      el("td", {}, runLink(r.id)), statusCell(r.status), el("td", { text: r.provider }),
      el("td", { text: conversationName(r) }), el("td", { text: when(r.submitted_at) }),
      r.finished_at == null && r.started_at != null ? ticking(r.started_at)
        : el("td", { class: "mono", text: r.started_at != null ? duration(r.finished_at - r.started_at) : "—" }),
      el("td", { text: r.reason || (r.exit_code != null ? `exit ${r.exit_code}` : "") }))), "No runs yet.");
  }

  function renderConfig() {
    const s = state.status;
    const last = s.last_reload;
    $("generation").replaceChildren(
      el("dt", { text: "generation" }), el("dd", { id: "generation-number", text: String(s.generation) }),
      el("dt", { text: "global cap" }), el("dd", { text: s.limits.global == null ? "none" : String(s.limits.global) }),
      el("dt", { text: "lost at start-up" }), el("dd", { text: String(s.lost_at_startup) }));
    const errors = $("reload-errors");
    // An alert is read out whenever its content changes: redraw it for another reload only.
    const shownReload = last && !last.ok ? `${last.at} ${last.trigger}` : "";
    if (errors.dataset.reload === shownReload) {
      // the same rejected reload (or none): leave the alert as it is
    } else if (last && !last.ok) {
      errors.dataset.reload = shownReload;
      errors.replaceChildren(el("strong", { text: `The reload at ${when(last.at)} (${last.trigger}) was rejected; generation ${last.generation} stays in force:` }),
        el("ul", {}, ...last.errors.map((e) => el("li", { class: "mono", text: e }))));
      errors.hidden = false;
    } else {
      errors.dataset.reload = "";
      errors.hidden = true;
    }
    $("last-reload").replaceChildren(last ? el("p", {
      text: `${last.ok ? "applied" : "rejected"} at ${when(last.at)} (${last.trigger}); ` +
        (last.ok ? (last.changes.length ? last.changes.map((c) => `${c.key}: ${c.change}`).join("; ") : "no changes") : `${last.errors.length} error(s)`),
    }) : el("p", { class: "hint", text: "No reload since the start." }));
    const restart = s.waiting_for_restart || [];
    $("restart").replaceChildren(...(restart.length ? restart.map((c) => el("li", { class: "mono", text: `${c.key}: ${JSON.stringify(c.old)} → ${JSON.stringify(c.new)}` })) : [el("li", { class: "hint", text: "nothing" })]));
    const fleet = state.fleet;
    if (!fleet) {
      $("fleet").replaceChildren(el("p", { class: "hint", text: "This supervisor runs alone (no fleet)." }));
    } else if (fleet.error) {
      $("fleet").replaceChildren(el("p", { class: "resting", text: fleet.error }));
    } else {
      const rows = fleet.members.map((m) => el("tr", {},
        el("td", { class: "mono", text: m.id + (m.this ? " (this one)" : "") }), el("td", { text: `${m.host} pid ${m.pid}` }),
        el("td", { class: "mono", text: String(m.running) }), el("td", { class: "mono", text: duration(m.lease_left) })));
      $("fleet").replaceChildren(el("div", { class: "scroll" }, el("table", {},
        el("thead", {}, el("tr", {}, ...["member", "where", "running", "lease left"].map((h) => el("th", { text: h })))),
        el("tbody", {}, ...rows))));
    }
  }

  function mergeTimeline() {
    for (const list of [state.recent, state.running, state.queued]) for (const r of list) timelineRuns.set(r.id, r);
    // Runs that ended before the window are let go: a page open for days holds only the window.
    const opens = now() - Number($("hours").value) * 3600;
    for (const [id, r] of timelineRuns) if (r.finished_at != null && r.finished_at < opens) timelineRuns.delete(id);
  }
  function renderTimeline() {
    if (timelineSince === null) return;
    const hours = Number($("hours").value);
    const opens = Math.max(timelineSince, now() - hours * 3600);
    const runs = [...timelineRuns.values()].filter((r) => (r.finished_at ?? Infinity) >= opens);
    // From the first run shown (less a margin), not from an empty start of the window.
    const first = Math.min(...runs.map((r) => r.submitted_at));
    const since = isFinite(first) ? Math.max(opens, first - Math.max(5, (now() - first) * 0.05)) : opens;
    window.HerdsmanTimeline.render($("timeline"), runs, {
      since, until: now(), lanes: $("lanes").value, link: (r) => `#log/${encodeURIComponent(r.id)}`,
    });
  }
  async function loadTimeline() {
    const hours = $("hours").value;
    const answer = await fetch(`/dashboard/timeline?hours=${hours}`, { credentials: "same-origin" }).then((r) => r.json());
    timelineRuns.clear();
    for (const r of answer.runs) timelineRuns.set(r.id, r);
    timelineSince = answer.since;
    if (state) mergeTimeline();
    renderTimeline();
  }

  async function loadWorktrees() {
    const answer = await fetch("/dashboard/worktrees", { credentials: "same-origin" }).then((r) => r.json());
    fill("worktrees", answer.worktrees.map((w) => el("tr", {},
      el("td", { text: (w.workspace !== "default" ? w.workspace + "/" : "") + w.conversation }), el("td", { text: w.repo }),
      el("td", { class: w.status === "clean" ? "" : "near", text: w.status + (w.changed && w.changed.length ? ` (${w.changed.length} changed)` : "") }),
      el("td", { text: when(Date.parse(w.last_used) / 1000) }), el("td", { class: "mono", text: `${(w.size_bytes / 1e6).toFixed(1)} MB` }),
      el("td", { class: "mono", text: w.path }))), "No worktrees: runs get one once a repo is configured.");
  }

  // -- a run and its log -----------------------------------------------------
  async function openLog(id) {
    clearTimeout(logTimer);
    logRun = { id, offset: 0 };
    $("log").textContent = "";
    $("log-title").textContent = `Run ${id}`;
    const response = await fetch(`/dashboard/runs/${encodeURIComponent(id)}`, { credentials: "same-origin" });
    const run = await response.json();
    if (!response.ok) { $("run-facts").replaceChildren(el("dt", { text: "error" }), el("dd", { text: run.error })); return; }
    showRun(run);
    followLog(logRun);
  }
  function showRun(run) {
    const facts = [["status", run.status], ["provider", run.provider], ["conversation", conversationName(run)],
      ["account", (run.account || "(ambient)") + accountMarks(run)], ["submitted", when(run.submitted_at)], ["started", when(run.started_at)],
      ["finished", when(run.finished_at)], ["exit code", run.exit_code], ["reason", run.reason], ["attempts", run.attempts],
      // Where a re-queued attempt went, and why (a refused login, a usage limit), one line each.
      ["notes", (run.notes || []).join("\n")],
      ["prompt", run.prompt], ["result", run.result]];
    $("run-facts").replaceChildren(...facts.filter(([, v]) => v !== null && v !== undefined && v !== "")
      .flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { "data-fact": k, text: String(v) })]));
    const cancel = $("log-cancel");
    const focused = document.activeElement === cancel;
    cancel.hidden = TERMINAL.has(run.status);
    // The run ended with the focus on its Cancel button: the focus goes to the run's heading.
    if (focused && cancel.hidden) $("log-title").focus();
    cancel.onclick = () => busy(cancel, () => cancelRun(run.id));
  }
  async function followLog(run) {
    if (logRun !== run) return;
    const response = await fetch(`/dashboard/runs/${encodeURIComponent(run.id)}/log?offset=${run.offset}`, { credentials: "same-origin" });
    if (logRun !== run || !response.ok) return;
    const piece = await response.json();
    const pre = $("log");
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    if (piece.text) pre.append(piece.text);
    if (atBottom) pre.scrollTop = pre.scrollHeight;
    run.offset = piece.offset;
    const ended = TERMINAL.has(piece.status);
    $("log-state").textContent = piece.error ? `(${piece.error})`
      : piece.missing ? (ended ? "(no log on this machine)" : "(not started yet)") : (ended ? "" : "(following)");
    if (piece.error) return;
    if (piece.more) { followLog(run); return; }
    if (!ended) logTimer = setTimeout(() => followLog(run), 1000);
  }

  // -- routing -----------------------------------------------------------------
  let routed = null;  // the hash the view shown was opened for
  function route(moved) {
    routed = location.hash;
    const hash = location.hash.slice(1) || "overview";
    const [view, ...rest] = hash.split("/");
    const known = ["overview", "runs", "accounts", "timeline", "worktrees", "config", "log"];
    const shown = known.includes(view) ? view : "overview";
    for (const section of document.querySelectorAll("main > section")) section.hidden = section.dataset.view !== shown;
    for (const a of document.querySelectorAll("nav a")) {
      if (a.getAttribute("href") === `#${shown}`) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
    }
    if (shown !== "log") { logRun = null; clearTimeout(logTimer); }
    if (shown === "log" && rest.length) openLog(decodeURIComponent(rest.join("/")));
    if (shown === "timeline") loadTimeline();
    if (shown === "worktrees") loadWorktrees();
    // Moved by the user (a link, not the first load): the keyboard goes on from the view's heading.
    if (moved) $(`view-${shown}`).querySelector("h2").focus();
    for (const box of $(`view-${shown}`).querySelectorAll(".scroll")) scrollable(box);
  }

  function render() {
    renderOverview();
    renderAccounts();
    renderRecent();
    renderConfig();
    mergeTimeline();
    if (!$("view-timeline").hidden) renderTimeline();
    if (logRun) {
      const r = state.recent.find((x) => x.id === logRun.id) || state.running.find((x) => x.id === logRun.id);
      if (r) fetch(`/dashboard/runs/${encodeURIComponent(r.id)}`, { credentials: "same-origin" })
        .then((x) => (x.ok ? x.json() : null)).then((run) => { if (run && logRun && run.id === logRun.id) showRun(run); });
    }
  }

  function take(text) {
    const snapshot = JSON.parse(text);
    skew = snapshot.at - Date.now() / 1000;
    state = snapshot.state;
    document.body.dataset.snapshot = String(snapshot.number);
    // The ledger's failure is said until it is over; an action's error until the next action.
    if (state.ledger_error) notice(`Runs cannot be listed: ${state.ledger_error}`);
    else if ($("notice").dataset.ledger) notice("");
    $("notice").dataset.ledger = state.ledger_error ? "yes" : "";
    render();
  }

  function connect() {
    stream = new EventSource("/dashboard/events");
    stream.addEventListener("state", (event) => {
      setLive("live", true);
      take(event.data);
    });
    stream.addEventListener("renew", () => { stream.close(); connect(); });
    stream.onerror = async () => {
      setLive("reconnecting…", false);
      if (stream.readyState === EventSource.CLOSED) {
        // Refused: logged out (the cookie ended) or the server went away.
        const answer = await fetch("/dashboard/state", { credentials: "same-origin" }).catch(() => null);
        if (answer && answer.status === 401) location.reload();
        else setTimeout(connect, 3000);
      }
    };
  }

  $("reload").addEventListener("click", () => busy($("reload"), async () => {
    const answer = await act("/dashboard/reload");
    if (answer.generation !== undefined) {
      announce(answer.ok ? `Reload applied: generation ${answer.generation}${answer.repeat ? " (the file had not changed)" : ""}.`
        : `Reload rejected, ${answer.errors.length} error(s); generation ${answer.generation} stays in force.`);
    }
  }));
  $("logout").addEventListener("click", async () => { await act("/logout"); location.reload(); });
  $("hours").addEventListener("change", loadTimeline);
  $("lanes").addEventListener("change", renderTimeline);
  $("worktrees-refresh").addEventListener("click", loadWorktrees);
  // A link within the page opens its view in the click itself: the hashchange
  // event comes later, as a task of its own, which the browser may run after a
  // key pressed meanwhile, and the view's heading would take the focus back from
  // that Tab. The hash is set as the link would set it (a history entry).
  document.addEventListener("click", (event) => {
    const link = event.target.closest('a[href^="#"]');
    if (!link || event.defaultPrevented || event.button !== 0) return;
    if (event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
    event.preventDefault();
    location.hash = link.getAttribute("href");  // a timeline bar is an SVG link: no .hash
    if (location.hash !== routed) route(true);
  });
  // Back, forward, or a hash typed: the event is all there is.
  window.addEventListener("hashchange", () => { if (location.hash !== routed) route(true); });
  window.addEventListener("resize", () => {
    if (!$("view-timeline").hidden) renderTimeline();
    for (const box of document.querySelectorAll(".scroll")) scrollable(box);
  });
  route(false);
  connect();
})();
