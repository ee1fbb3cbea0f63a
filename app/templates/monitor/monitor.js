// The study monitor: polls the board with its ETag (304 while unchanged), redraws on change,
// advances running clocks locally between answers, filters and sorts in the browser.
(function () {
  "use strict";
  const root = document.getElementById("monitor");
  if (!root) return;
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  let board = JSON.parse(document.getElementById("board-data").textContent);
  let etag = root.dataset.etag;
  let receivedAt = performance.now();
  let sortKey = "id";
  let sortDir = 1;

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, v);
    }
    for (const child of children || []) node.append(child);
    return node;
  }
  function hms(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return h + ":" + String(m).padStart(2, "0") + ":" + String(s % 60).padStart(2, "0");
  }
  function when(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return d.toISOString().replace("T", " ").slice(0, 19);
  }
  function ago(iso) {
    if (!iso) return "never";
    const s = (Date.now() - new Date(iso).getTime()) / 1000;
    if (s < 90) return Math.max(0, Math.round(s)) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    if (s < 172800) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " days ago";  // an archived or imported study's
  }
  function money(x, cents = 2) {
    return "$" + Number(x || 0).toLocaleString("en-US", { minimumFractionDigits: cents, maximumFractionDigits: cents });
  }
  function elapsed() { return (performance.now() - receivedAt) / 1000; }
  function working(a) {
    return a.clock === "running" ? Math.min(a.working_s + elapsed() * a.time_scale, a.limit_s) : a.working_s;
  }
  function openAlertSubjects() {
    return new Set(board.alerts.filter((x) => !x.cleared_at).map((x) => x.subject));
  }

  function summary() {
    const box = document.getElementById("mon-summary");
    const count = (f) => board.attempts.filter(f).length;
    const open = board.alerts.filter((x) => !x.cleared_at).length;
    const q = board.queue;
    const s = board.spend;
    const hostsUp = board.hosts.filter((h) => h.enabled && h.healthy).length;
    const cards = [
      ["Running", count((a) => a.clock === "running")],
      ["Paused", count((a) => a.clock === "paused")],
      ["Open alerts", open],
      ["Scoring queue", q.reproductions_queued + q.gradings_queued,
        q.oldest_age_s == null ? "nothing queued" : q.reproductions_queued + " reproductions, " + q.gradings_queued + " gradings queued; oldest waiting " + hms(q.oldest_age_s + elapsed())],
      ["Hosts up", hostsUp + " / " + board.hosts.length],
      ["Spend", money(s.total_usd, s.total_usd >= 1000 ? 0 : 2), s.budget_usd == null ? "no budget set"
        : Math.round((s.share || 0) * 100) + "% of " + money(s.budget_usd) + " (judge " + money(s.judge_usd) + ", agents " + money(s.agent_usd) + ")"],
    ];
    box.replaceChildren(...cards.map(([label, value, hint]) => el("div", { class: "card", "data-card": label }, [
      el("div", { class: "hint", text: label }),
      el("div", { class: "stat", text: String(value) }),
      ...(hint ? [el("div", { class: "hint", text: hint })] : []),
    ])));
  }

  function ackButton(alert) {
    const form = el("form", { method: "post", class: "inline", action: root.dataset.ackUrl.replace("/alerts/0/", "/alerts/" + alert.id + "/") }, [
      el("input", { type: "hidden", name: "csrf_token", value: csrf }),
      el("button", { class: "secondary", text: "Acknowledge" }),
    ]);
    return form;
  }

  function alertsTable() {
    const body = document.querySelector("#alerts-table tbody");
    if (!board.alerts.length) {
      body.replaceChildren(el("tr", {}, [el("td", { colspan: "6", class: "muted", text: "No alerts." })]));
      return;
    }
    body.replaceChildren(...board.alerts.map((x) => el("tr", { class: x.cleared_at ? "" : "alerting", "data-alert": String(x.id) }, [
      el("td", { class: "when", text: when(x.fired_at) }),
      el("td", {}, [el("span", { class: "pill " + (x.cleared_at ? "" : "bad"), text: x.rule.replaceAll("_", " ") })]),
      el("td", { text: x.subject }),
      el("td", { text: x.message }),
      el("td", { class: "when", text: x.cleared_at ? when(x.cleared_at) : "open" }),
      el("td", {}, x.acknowledged_at ? [document.createTextNode((x.acknowledged_by || "?") + ", " + when(x.acknowledged_at))] : [ackButton(x)]),
    ])));
  }

  function sortValue(a) {
    switch (sortKey) {
      case "snapshot": return a.last_snapshot ? a.last_snapshot.taken_at : "";
      case "grade": return a.last_grade && a.last_grade.score != null ? a.last_grade.score : -1;
      case "working_s": return working(a);
      case "host": return (a.host || "") + (a.workspace || "");
      case "last_activity_at": return a.last_activity_at || "";
      default: return a[sortKey];
    }
  }

  function attemptsTable() {
    const text = document.getElementById("f-text").value.trim().toLowerCase();
    const kind = document.getElementById("f-kind").value;
    const clock = document.getElementById("f-clock").value;
    const alerting = document.getElementById("f-alerting").checked;
    const open = openAlertSubjects();
    const rows = board.attempts.filter((a) =>
      (!kind || a.kind === kind) && (!clock || a.clock === clock) &&
      (!alerting || open.has("attempt:" + a.id)) &&
      (!text || (a.id + " " + a.participant + " " + a.pseudonym + " " + a.task + " " + a.group).toLowerCase().includes(text)));
    rows.sort((x, y) => {
      const a = sortValue(x), b = sortValue(y);
      return (a < b ? -1 : a > b ? 1 : 0) * sortDir || x.id - y.id;
    });
    document.getElementById("attempt-count").textContent = rows.length + " of " + board.attempts.length;
    document.querySelectorAll("#attempts-table th.sortable").forEach((th) => {
      th.classList.toggle("sorted-asc", th.dataset.key === sortKey && sortDir === 1);
      th.classList.toggle("sorted-desc", th.dataset.key === sortKey && sortDir === -1);
    });
    const body = document.querySelector("#attempts-table tbody");
    if (!rows.length) {
      body.replaceChildren(el("tr", {}, [el("td", { colspan: "11", class: "muted", text: board.attempts.length ? "No attempt matches the filters." : "No attempts yet." })]));
      return;
    }
    body.replaceChildren(...rows.map((a) => {
      const snap = a.last_snapshot;
      const grade = a.last_grade;
      const state = a.clock === "paused" ? "paused (" + (a.pause_reason || "?").replaceAll("_", " ") + ")" : a.clock;
      // every pause with its note in the cell's tooltip; the cell itself says how many and why
      // the last one was taken, so neither a long history nor a long note makes each row a
      // column of text
      const pauses = a.pauses.map((p) => p.reason.replaceAll("_", " ") + (p.note ? " \u2014 " + p.note : "") + (p.ended_at ? "" : " (open)"));
      const last = a.pauses[a.pauses.length - 1];
      const late = a.missing_checkpoints.length ? " · missing " + a.missing_checkpoints.map((m) => (m.due_working_s / 3600) + " h").join(", ") : "";
      return el("tr", { class: open.has("attempt:" + a.id) ? "alerting" : "", "data-attempt": String(a.id) }, [
        el("td", { text: String(a.id) }),
        el("td", { text: a.participant + " (" + a.kind + ")" }),
        el("td", { text: a.task }),
        el("td", {}, [el("span", { class: "pill " + (a.clock === "running" ? "running" : a.clock === "paused" ? "paused" : ""), text: state }),
          document.createTextNode(a.status !== a.clock ? " " + a.status : "")]),
        el("td", { class: "num working", text: hms(working(a)) + " / " + hms(a.limit_s) }),
        el("td", { title: a.hub_activity_unknown || "", text: ago(a.last_activity_at) + (a.idle_working_s != null && a.idle_working_s > 600 ? " (idle " + hms(a.idle_working_s + elapsed() * a.time_scale) + ")" : "") + (a.hub_activity_unknown ? " (JupyterHub's activity unknown)" : "") }),
        el("td", { text: snap ? snap.kind + " at " + hms(snap.working_s) + (snap.late ? " (late)" : "") + late : "none" + late }),
        el("td", { class: "num", text: grade ? (grade.score != null ? grade.score.toFixed(3) : grade.status) : "" }),
        el("td", { class: "pauses", title: pauses.join("\n"), text: last ? pauses.length + " (last: " + last.reason.replaceAll("_", " ") + (last.ended_at ? "" : ", open") + ")" : "" }),
        el("td", { class: "num", text: money(a.cost_usd) }),
        el("td", { text: a.workspace ? (a.workspace_status + " on " + (a.host || "?")) : "" }),
      ]);
    }));
  }

  function hostsTable() {
    const body = document.querySelector("#hosts-table tbody");
    if (!board.hosts.length) {
      body.replaceChildren(el("tr", {}, [el("td", { colspan: "6", class: "muted", text: "No hosts." })]));
      return;
    }
    body.replaceChildren(...board.hosts.map((h) => el("tr", { class: h.enabled && !h.healthy && h.last_checked_at ? "alerting" : "", "data-host": String(h.id) }, [
      el("td", { text: h.name }),
      el("td", {}, [el("span", { class: "pill " + (!h.enabled ? "" : h.healthy ? "running" : "bad"), text: !h.enabled ? "disabled" : h.healthy ? "healthy" : "down" })]),
      el("td", { class: "num", text: h.gpus_free + " / " + h.gpus_total }),
      el("td", { class: "num", text: String(h.running_workspaces) }),
      el("td", { text: ago(h.last_checked_at) }),
      el("td", { text: h.last_error || "" }),
    ])));
  }

  function render() {
    summary();
    alertsTable();
    attemptsTable();
    hostsTable();
    document.getElementById("mon-updated").textContent = new Date().toISOString().slice(11, 19) + " UTC";
  }

  async function poll() {
    try {
      const answer = await fetch(root.dataset.boardUrl, { headers: { "If-None-Match": etag }, credentials: "same-origin", cache: "no-store" });
      if (answer.status === 200) {
        board = await answer.json();
        etag = answer.headers.get("ETag") || etag;
        receivedAt = performance.now();
        root.dataset.etag = etag;
        render();
      } else if (answer.status === 304) {
        attemptsTable();
        summary();
        document.getElementById("mon-updated").textContent = new Date().toISOString().slice(11, 19) + " UTC";
      } else {
        document.getElementById("mon-updated").textContent = "failed (HTTP " + answer.status + ")";
      }
    } catch (err) {
      document.getElementById("mon-updated").textContent = "failed (" + err + ")";
    }
    setTimeout(poll, Number(root.dataset.pollMs));
  }

  document.querySelectorAll("#attempts-table th.sortable").forEach((th) => th.addEventListener("click", () => {
    if (sortKey === th.dataset.key) sortDir = -sortDir; else { sortKey = th.dataset.key; sortDir = 1; }
    attemptsTable();
  }));
  ["f-text", "f-kind", "f-clock", "f-alerting"].forEach((id) => document.getElementById(id).addEventListener("input", attemptsTable));
  render();
  setTimeout(poll, Number(root.dataset.pollMs));
})();
