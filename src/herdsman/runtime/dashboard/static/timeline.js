// The timeline of runs: bars per provider slot or per conversation, coloured
// by outcome, with the wait before each start drawn as a pale bar. Used by the
// dashboard and by `herdsman sim view`'s page, which hands it a trace's runs.
"use strict";
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const LANE = 20, BAR = 14, LABEL = 190, AXIS = 22;

  function node(tag, attrs, text) {
    const n = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
    if (text !== undefined) n.textContent = text;
    return n;
  }

  function clock(t, step) {
    const d = new Date(t * 1000);
    return d.toTimeString().slice(0, step < 60 ? 8 : 5);
  }

  // Each provider's runs on slots: a run takes the first slot free at its start.
  function slotLanes(runs) {
    const byProvider = new Map();
    for (const r of runs) {
      if (r.started_at == null) continue;
      if (!byProvider.has(r.provider)) byProvider.set(r.provider, []);
      byProvider.get(r.provider).push(r);
    }
    const lanes = [];
    for (const provider of [...byProvider.keys()].sort()) {
      const list = byProvider.get(provider).sort((a, b) => a.started_at - b.started_at || (a.id < b.id ? -1 : 1));
      const ends = [], slots = [];
      for (const r of list) {
        let i = ends.findIndex((end) => end <= r.started_at);
        if (i < 0) { i = ends.length; ends.push(0); slots.push([]); }
        ends[i] = r.finished_at == null ? Infinity : r.finished_at;
        slots[i].push(r);
      }
      slots.forEach((s, i) => lanes.push({ label: `${provider} slot ${i + 1}`, runs: s, waits: false }));
    }
    return lanes;
  }

  function conversationLanes(runs) {
    const by = new Map();
    for (const r of runs) {
      // A run without a conversation has a lane of its own, named by its id (as `sim view` draws it).
      const key = r.conversation == null ? r.id
        : (r.workspace && r.workspace !== "default" ? r.workspace + "/" : "") + r.conversation;
      if (!by.has(key)) by.set(key, []);
      by.get(key).push(r);
    }
    return [...by.keys()].sort().map((key) => ({ label: key, runs: by.get(key), waits: true }));
  }

  function describe(r) {
    const parts = [`${r.id} — ${r.status}`, `${r.provider} · ${r.conversation ?? "no conversation"}`];
    if (r.started_at != null) parts.push(`waited ${Math.round(r.started_at - r.submitted_at)} s`);
    if (r.started_at != null && r.finished_at != null) parts.push(`ran ${Math.round(r.finished_at - r.started_at)} s`);
    if (r.reason) parts.push(r.reason);
    return parts.join("\n");
  }

  // One Tab stop for all the bars (a roving tabindex): the current bar has
  // tabindex 0, every other -1, and the arrow keys move the current bar and the
  // focus along the bars in the order drawn (lane by lane, each lane in time
  // order): Right and Down to the next, Left and Up to the previous, Home and
  // End to the first and the last. The current bar is remembered by run id on
  // the container, so a redraw (the live stream's) keeps it, and keeps the
  // focus on it if a bar had the focus.
  function rove(container, svg, hadFocus) {
    const links = [...svg.querySelectorAll("a[data-run]")];
    if (!links.length) return;
    let current = links.find((a) => a.dataset.run === container.dataset.current) || links[0];
    const make = (link) => {
      current.setAttribute("tabindex", "-1");
      link.setAttribute("tabindex", "0");
      current = link;
      container.dataset.current = link.dataset.run;
    };
    make(current);
    if (hadFocus) current.focus();
    const onKey = (event) => {
      const at = links.indexOf(current);
      const to = { ArrowRight: at + 1, ArrowDown: at + 1, ArrowLeft: at - 1, ArrowUp: at - 1, Home: 0, End: links.length - 1 }[event.key];
      if (to === undefined || event.altKey || event.ctrlKey || event.metaKey) return;
      event.preventDefault();  // the arrows move the bar, not the page
      make(links[Math.max(0, Math.min(links.length - 1, to))]);
      current.focus();
    };
    // A click (or a screen reader's own navigation) makes the bar it lands on current.
    const onFocus = (event) => { if (event.currentTarget !== current) make(event.currentTarget); };
    // On each bar, not on the svg: Chromium makes an svg that listens for keys a tab stop of its own.
    for (const link of links) {
      link.addEventListener("keydown", onKey);
      link.addEventListener("focus", onFocus);
    }
  }

  // Draws `runs` between `since` and `until` (unix seconds) into `container`.
  // options.lanes: "slot" or "conversation"; options.link(run): a URL or null.
  function render(container, runs, options) {
    const hadFocus = container.contains(document.activeElement);
    const since = options.since, until = Math.max(options.until, since + 1);
    const lanes = options.lanes === "conversation" ? conversationLanes(runs) : slotLanes(runs);
    container.replaceChildren();
    if (!lanes.length) {
      const p = document.createElement("p");
      p.className = "hint";
      p.style.padding = "0 .7rem";
      p.textContent = "No runs in this window.";
      container.append(p);
      return;
    }
    const width = Math.max(container.clientWidth || 0, 720);
    const plot = width - LABEL - 10;
    const height = AXIS + lanes.length * LANE + 4;
    const x = (t) => LABEL + Math.max(0, Math.min(1, (t - since) / (until - since))) * plot;
    // With links to the runs, the bars are controls, which an image may not hold: a group then,
    // each link named in words (its outcome is its colour to the eye).
    const svg = node("svg", { width, height, role: options.link ? "group" : "img", "aria-label": `Timeline of ${runs.length} runs` });
    const span = until - since;
    const steps = [10, 30, 60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600];
    const step = steps.find((s) => span / s <= 8) || 43200;
    for (let t = Math.ceil(since / step) * step; t <= until; t += step) {
      svg.append(node("line", { x1: x(t), x2: x(t), y1: AXIS - 4, y2: height, class: "grid" }));
      if (x(t) + 50 < width) svg.append(node("text", { x: x(t) + 2, y: 12, class: "tick" }, clock(t, step)));
    }
    lanes.forEach((lane, i) => {
      const y = AXIS + i * LANE;
      svg.append(node("text", { x: 4, y: y + BAR - 2, class: "lane-label" }, lane.label.slice(0, 30)));
      for (const r of lane.runs) {
        const end = r.finished_at == null ? until : r.finished_at;
        const group = options.link && options.link(r)
          ? node("a", { href: options.link(r), "aria-label": describe(r).replaceAll("\n", ", "), "data-run": r.id, tabindex: -1 })
          : node("g");
        group.append(node("title", {}, describe(r)));
        if (lane.waits) {
          const waitEnd = r.started_at == null ? end : r.started_at;
          if (waitEnd > since && waitEnd - r.submitted_at > 0) {
            group.append(node("rect", { x: x(r.submitted_at), y: y + 4, width: Math.max(1, x(waitEnd) - x(r.submitted_at)), height: BAR - 8, class: "bar wait" }));
          }
        }
        if (r.started_at != null && end >= since) {
          const cls = r.finished_at == null ? "running" : r.status;
          group.append(node("rect", { x: x(r.started_at), y, width: Math.max(2, x(end) - x(r.started_at)), height: BAR, rx: 2, class: `bar ${cls}`, "data-run": r.id }));
        }
        svg.append(group);
      }
    });
    container.append(svg);
    rove(container, svg, hadFocus);
  }

  window.HerdsmanTimeline = { render };
})();
