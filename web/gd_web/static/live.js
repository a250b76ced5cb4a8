// Live updates: every 2 s the page's live part (<main data-live>) is fetched
// again and swapped in, keeping which <details> are open; paused while the
// tab is hidden.  Without JavaScript the pages work as they are.
(function () {
  'use strict';
  const live = document.getElementById('live');
  if (!live || !live.dataset.live) return;
  const every = Number(live.dataset.live) || 2000;
  async function refresh() {
    if (document.hidden) return;
    const closed = new Set([...live.querySelectorAll('details[id]')].filter((d) => !d.open).map((d) => d.id));
    try {
      const response = await fetch(location.href, { headers: { 'X-GD-Live': '1' }, credentials: 'same-origin' });
      if (!response.ok) return;
      live.innerHTML = await response.text();
      for (const id of closed) {
        const details = document.getElementById(id);
        if (details) details.open = false;
      }
      live.dataset.refreshed = String(Date.now());
    } catch (error) {
      // the server is away for a moment: try again next time
    }
  }
  setInterval(refresh, every);
})();
