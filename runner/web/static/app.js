// runner's web page: keeps the jobs list and a job's page current, and loads (and follows) its logs.
// Fragments come from the server already escaped; log output is only ever inserted as text.
"use strict";

(function () {
  const LIST_EVERY_MS = 3000;   // the jobs list and a running job's summary
  const FOLLOW_EVERY_MS = 1000; // new log output while following

  function banner(text) {
    const element = document.getElementById("banner");
    element.textContent = text;
    element.hidden = !text;
  }

  let signedOut = false;

  async function get(url) {
    const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    if (response.status === 401) {
      signedOut = true;
      banner("Signed out: run `runner dashboard` to sign this browser in again.");
      throw new Error("signed out");
    }
    if (!response.ok) throw new Error(url + ": " + response.status);
    banner("");
    return response;
  }

  function every(ms, task) {
    let running = false;
    const timer = setInterval(async function () {
      if (signedOut) return clearInterval(timer);
      if (running || document.hidden) return;
      running = true;
      try {
        if ((await task()) === false) clearInterval(timer);
      } catch (error) {
        if (!signedOut) banner("Cannot reach the controller; retrying.");
      } finally {
        running = false;
      }
    }, ms);
  }

  // The jobs list: its rows, re-rendered by the server.
  const jobsBody = document.getElementById("jobs-body");
  if (jobsBody) {
    every(LIST_EVERY_MS, async function () {
      jobsBody.innerHTML = await (await get(jobsBody.dataset.poll)).text();
    });
  }

  // A job's page: the summary (timeline, drill, cost) until the job ends, and one log pane per attempt/node.
  const summary = document.getElementById("job-summary");
  const logs = document.getElementById("logs");
  if (!summary || !logs) return;

  const panes = new Map(); // "attempt:node" -> {pre, offset, complete, loading}
  const follow = document.getElementById("follow");
  let following = false;

  function summaryData() {
    return summary.querySelector(".summary-data").dataset;
  }

  async function load(pane) {
    if (pane.loading || pane.complete) return false;
    pane.loading = true;
    let grew = false;
    try {
      for (;;) {
        const query = new URLSearchParams({ attempt: pane.attempt, node: pane.node, offset: pane.offset });
        const chunk = await (await get(logs.dataset.logsUrl + "?" + query)).json();
        if (chunk.data) {
          pane.pre.appendChild(document.createTextNode(chunk.data));
          grew = true;
        }
        pane.offset = chunk.offset;
        pane.complete = chunk.complete;
        if (!chunk.data || chunk.complete) break;
      }
    } finally {
      pane.loading = false;
    }
    return grew;
  }

  function syncPanes() {
    const container = document.getElementById("log-panes");
    for (const source of JSON.parse(summaryData().logs)) {
      const key = source.attempt + ":" + source.node;
      let pane = panes.get(key);
      if (!pane) {
        const section = document.createElement("section");
        section.className = "log-pane";
        section.dataset.attempt = source.attempt;
        section.dataset.node = source.node;
        const heading = document.createElement("h3");
        const pre = document.createElement("pre");
        section.append(heading, pre);
        container.appendChild(section);
        pane = { attempt: source.attempt, node: source.node, heading: heading, pre: pre, offset: 0, complete: false };
        panes.set(key, pane);
        load(pane).catch(function () {});
      }
      pane.heading.textContent = source.label;
    }
  }

  async function followOnce() {
    let grew = false;
    for (const pane of panes.values()) {
      if (await load(pane)) grew = true;
    }
    if (grew && following) {
      const last = Array.from(panes.values()).pop();
      last.pre.scrollTop = last.pre.scrollHeight;
      last.pre.scrollIntoView({ block: "end" });
    }
  }

  syncPanes();
  if (summaryData().terminal !== "true") {
    every(LIST_EVERY_MS, async function () {
      summary.innerHTML = await (await get(summary.dataset.poll)).text();
      syncPanes();
      if (summaryData().terminal !== "true") return true;
      await followOnce(); // the job has ended: read every log to its end, then stop
      return false;
    });
  }

  follow.addEventListener("click", function () {
    following = !following;
    follow.setAttribute("aria-pressed", String(following));
    if (following) followOnce().catch(function () {});
  });
  every(FOLLOW_EVERY_MS, async function () {
    if (following) await followOnce();
  });
})();
