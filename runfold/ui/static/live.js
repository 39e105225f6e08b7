// runfold inspector: follow a live run. While the run page says the run is live, ask the server
// for the run's head every data-poll-ms; when it moved, fetch this page again and swap its <main>
// in (the server rendered and escaped it; nothing here builds HTML from data).
"use strict";
(function () {
  function follow() {
    const main = document.getElementById("run");
    if (!main || main.dataset.live !== "true") return;
    const every = Number(main.dataset.pollMs) || 1000;
    const headUrl = "/api/head?run_id=" + encodeURIComponent(main.dataset.runId);
    async function poll() {
      const current = document.getElementById("run");
      try {
        const reply = await fetch(headUrl, { cache: "no-store" });
        if (reply.ok) {
          const head = await reply.json();
          if (String(head.last_sequence) !== current.dataset.head) {
            const page = await fetch(window.location.href, { cache: "no-store" });
            if (page.ok) {
              const doc = new DOMParser().parseFromString(await page.text(), "text/html");
              const fresh = doc.getElementById("run");
              if (fresh) {
                current.replaceWith(document.adoptNode(fresh));
                if (fresh.dataset.live !== "true") return;
              }
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
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", follow);
  } else {
    follow();
  }
})();
