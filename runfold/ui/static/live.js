// runfold inspector: a run's page. Its first screen is the run's index row and a page of its
// history; this fetches the details (payloads, timeline, a page of each table) and, while the
// run is live, asks the server for the run's head every data-poll-ms. When the head moved it
// fetches the details again (a bounded fragment) and only the history rows after the last one
// shown. The server renders and escapes every fragment; nothing here builds HTML from data.
"use strict";
(function () {
  function parse(html) {
    return new DOMParser().parseFromString(html, "text/html");
  }

  async function loadDetails(main) {
    const reply = await fetch(main.dataset.details, { cache: "no-store" });
    if (!reply.ok) return null;
    const fresh = parse(await reply.text()).getElementById("details");
    const current = document.getElementById("details");
    if (!fresh || !current) return null;
    current.replaceWith(document.adoptNode(fresh));
    return fresh;
  }

  async function appendEvents(main) {
    const url = "/runs/" + encodeURIComponent(main.dataset.runId) + "/events?after=" +
      encodeURIComponent(main.dataset.lastShown) + "&limit=" + encodeURIComponent(main.dataset.limit);
    const reply = await fetch(url, { cache: "no-store" });
    if (!reply.ok) return;
    const doc = parse("<table><tbody>" + (await reply.text()) + "</tbody></table>");
    const body = document.querySelector("#history tbody");
    for (const row of Array.from(doc.querySelectorAll("tbody > tr"))) {
      body.appendChild(document.adoptNode(row));
      main.dataset.lastShown = row.dataset.sequence;
    }
    document.getElementById("history-last").textContent = main.dataset.lastShown;
  }

  function setText(id, text) {
    const node = document.getElementById(id);
    if (node) node.textContent = text;
  }

  function follow(main) {
    const every = Number(main.dataset.pollMs) || 1000;
    const headUrl = "/api/head?run_id=" + encodeURIComponent(main.dataset.runId);
    async function poll() {
      try {
        const reply = await fetch(headUrl, { cache: "no-store" });
        if (reply.ok) {
          const head = await reply.json();
          if (String(head.last_sequence) !== main.dataset.head) {
            main.dataset.head = String(head.last_sequence);
            const status = document.getElementById("run-status");
            status.textContent = head.status;
            status.className = "status status-" + head.status;
            setText("run-events", String(head.last_sequence));
            setText("history-of", String(head.last_sequence));
            await loadDetails(main);
            if (main.dataset.atTail === "true") await appendEvents(main);
            if (!head.live) {
              main.dataset.live = "false";
              for (const badge of document.querySelectorAll(".live-badge")) badge.remove();
              return;
            }
          }
        }
      } catch (error) {
        // The server may be restarting: try again on the next tick.
      }
      window.setTimeout(poll, every);
    }
    window.setTimeout(poll, every);
  }

  async function start() {
    const main = document.getElementById("run");
    if (!main) return;
    try {
      await loadDetails(main);
    } catch (error) {
      // The link in the placeholder still leads to the details.
    }
    if (main.dataset.live === "true") follow(main);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
