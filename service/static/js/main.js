// Page wiring: upload form, job list (polled), and the selected job's live detail (SSE).

import * as api from "./api.js";
import { el } from "./dom.js";
import { LossPlot } from "./plot.js";
import { ExportPanel } from "./exports.js";
import { SplatViewer } from "./splat_viewer.js";
import { makeViewer } from "./viewer.js";

const $ = (id) => document.getElementById(id);
const hasWebGL2 = () => !!document.createElement("canvas").getContext("webgl2");
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const LIST_EVERY_MS = 2000;

const CONFIG_EXAMPLES = {
  image: { steps: 2000, encoding: "fourier", resolution: 64 },
  nerf: {},
  splat: {},
};

// ---- formatting ----------------------------------------------------------------------

const shortId = (id) => id.slice(0, 8);
const badge = (status) => el("span", { class: `badge ${status}` }, status);

function fmtDuration(s) {
  if (!Number.isFinite(s)) return "–";
  if (s < 60) return `${Math.round(s)} s`;
  const m = Math.floor(s / 60);
  return m < 60 ? `${m} min ${Math.round(s % 60)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

function progressText(p, status) {
  if (!p || !p.total_steps) return status === "queued" ? "waiting for a worker…" : "";
  if (p.stage === "sfm") {
    const eta = status === "running" && p.eta_s != null ? ` · ETA ${fmtDuration(p.eta_s)}` : "";
    return `structure from motion ${p.step} %${eta}`;
  }
  const bits = [`step ${p.step} / ${p.total_steps}`];
  if (p.loss != null) bits.push(`loss ${Number(p.loss).toPrecision(3)}`);
  if (p.psnr != null) bits.push(`PSNR ${Number(p.psnr).toFixed(2)} dB`);
  if (p.elapsed_s) bits.push(`elapsed ${fmtDuration(p.elapsed_s)}`);
  if (status === "running" && p.eta_s != null) bits.push(`ETA ${fmtDuration(p.eta_s)}`);
  return bits.join(" · ");
}

const fraction = (p) => (p && p.total_steps ? Math.min(1, p.step / p.total_steps) : 0);

// ---- upload --------------------------------------------------------------------------

function setupUpload() {
  const kind = $("kind"), file = $("dataset"), config = $("config"), msg = $("upload-msg");
  const accept = { image: "image/png,image/jpeg,.png,.jpg,.jpeg", nerf: ".zip,.tar,.tar.gz,.tgz,application/zip,.mp4,.mov,.m4v,.webm,.mkv,video/*" };
  accept.splat = accept.nerf;
  const applyKind = () => {
    file.accept = accept[kind.value] || "";
    const ex = JSON.stringify(CONFIG_EXAMPLES[kind.value] || {});
    // keep what the user typed unless it is still another kind's example
    if (!config.value.trim() || Object.values(CONFIG_EXAMPLES).some((e) => JSON.stringify(e) === config.value.trim())) config.value = ex;
  };
  kind.addEventListener("change", applyKind);
  applyKind();

  $("upload-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    msg.className = "msg";
    if (!file.files.length) { msg.textContent = "choose a file first"; msg.className = "msg error"; return; }
    const text = config.value.trim();
    if (text) {
      try { JSON.parse(text); } catch (err) {
        msg.textContent = `config is not valid JSON: ${err.message}`;
        msg.className = "msg error";
        return;
      }
    }
    $("submit").disabled = true;
    msg.textContent = `uploading ${file.files[0].name}…`;
    try {
      const job = await api.submitJob(kind.value, file.files[0], text);
      msg.textContent = `job ${shortId(job.id)} queued`;
      msg.className = "msg ok";
      await refreshList();
      select(job.id);
    } catch (err) {
      msg.textContent = `upload refused: ${err.message}`;
      msg.className = "msg error";
    } finally {
      $("submit").disabled = false;
    }
  });
}

// ---- job list ------------------------------------------------------------------------

let selectedId = null;

// Rows are kept and updated in place: a row rebuilt between a click's press and release (the
// list refreshes every LIST_EVERY_MS) would swallow the click.
function jobRow(job) {
  // Set through the CSSOM: the page's Content-Security-Policy refuses style attributes.
  const bar = el("span");
  const state = el("td", {});
  const tr = el("tr", { "data-id": job.id },
    el("td", {}, el("code", {}, shortId(job.id))),
    el("td", {}, job.kind),
    state,
    el("td", {}, el("span", { class: "mini" }, bar)),
    el("td", { class: "muted" }, new Date(job.created_at).toLocaleTimeString()));
  tr.addEventListener("click", () => select(job.id));
  tr.view = { bar, state, status: null };
  return tr;
}

function updateRow(tr, job) {
  const v = tr.view;
  v.bar.style.width = `${Math.round(fraction(job.progress) * 100)}%`;
  if (v.status !== job.status) {
    v.state.replaceChildren(badge(job.status));
    v.status = job.status;
  }
  tr.classList.toggle("selected", job.id === selectedId);
}

async function refreshList() {
  try {
    const list = await api.listJobs();
    const body = document.querySelector("#jobs tbody");
    const have = new Map([...body.children].map((tr) => [tr.dataset.id, tr]));
    const rows = list.items.map((job) => {
      const tr = have.get(job.id) ?? jobRow(job);
      updateRow(tr, job);
      return tr;
    });
    const same = rows.length === body.children.length && rows.every((tr, i) => body.children[i] === tr);
    if (!same) body.replaceChildren(...rows);
    $("jobs-count").textContent = list.total ? `(${list.total})` : "";
    $("jobs-msg").textContent = list.total ? "" : "no jobs yet";
    $("jobs-msg").className = "msg muted";
  } catch (err) {
    $("jobs-msg").textContent = `could not list jobs: ${err.message}`;
    $("jobs-msg").className = "msg error";
  }
}

// ---- selected job --------------------------------------------------------------------

let detail = null; // {id, source, viewer, job}
let plot = null;

function showJob(job) {
  detail.job = job;
  $("d-id").textContent = job.id;
  $("d-status").replaceWith(Object.assign(badge(job.status), { id: "d-status" }));
  $("d-bar").style.width = `${Math.round(fraction(job.progress) * 100)}%`;
  $("d-progress-text").textContent = progressText(job.progress, job.status);
  const metrics = Object.entries(job.metrics || {}).filter(([, v]) => typeof v === "number");
  $("d-metrics").hidden = metrics.length === 0;
  $("d-metrics").textContent = metrics.length
    ? "result: " + metrics.map(([k, v]) => `${k} ${Number.isInteger(v) ? v : v.toFixed(k.includes("psnr") ? 2 : 3)}`).join(" · ")
    : "";
  $("d-error").hidden = !job.error;
  $("d-error").textContent = job.error ? `error: ${job.error}` : "";
  $("d-cancel").hidden = TERMINAL.has(job.status);
  $("d-meta").textContent = JSON.stringify({ config: job.config, dataset: job.dataset, metrics: job.metrics }, null, 2);
  // Scene jobs preview while they train: the viewer appears with the first checkpoint and
  // re-renders as each new one lands.
  const ckpt = job.progress && job.progress.checkpoint_step;
  if (job.kind !== "image" && job.status === "running" && ckpt != null) {
    if (!detail.viewer) {
      detail.viewer = makeViewer($("viewer"), job);
      detail.preview = true;
    }
    detail.viewer.checkpointLanded?.(ckpt);
  }
  document.querySelectorAll("#jobs tbody tr").forEach((tr) => tr.classList.toggle("selected", tr.dataset.id === job.id));
}

async function onFinished(id) {
  const job = await api.getJob(id);
  if (!detail || detail.id !== id) return;
  showJob(job);
  refreshList();
  if (job.status === "succeeded") {
    if (detail.preview && job.kind === "splat") {
      // the training preview gives way to the browser-drawn Gaussians
      detail.viewer.dispose();
      detail.viewer = null;
    }
    if (!detail.viewer) {
      // splat jobs are drawn in the browser from their .splat export (server renders where the
      // browser has no WebGL2); other kinds by the server
      detail.viewer = job.kind === "splat" && hasWebGL2() ? new SplatViewer($("viewer"), job) : makeViewer($("viewer"), job);
    }
    if (!detail.exports && job.kind !== "image") detail.exports = new ExportPanel($("exports"), job);
    offerCheckpoint(job);
  }
}

async function offerCheckpoint(job) {
  const url = api.jobUrl(job.id, "/checkpoint");
  const link = $("d-checkpoint"), msg = $("d-checkpoint-msg");
  if (await api.available(url)) {
    // A plain link cannot send the key: the click fetches it with the key and hands the
    // browser a blob URL instead (the href stays the real URL, for copying).
    link.href = url;
    link.onclick = async (ev) => {
      ev.preventDefault();
      try {
        const blobUrl = URL.createObjectURL(await api.download(url));
        const a = el("a", { href: blobUrl, download: `${job.id}.safetensors` });
        a.click();
        setTimeout(() => URL.revokeObjectURL(blobUrl), 60000);
      } catch (err) {
        msg.textContent = `download failed: ${err.message}`;
      }
    };
    link.setAttribute("download", `${job.id}.safetensors`);
    link.hidden = false;
    msg.textContent = "";
  } else {
    link.hidden = true;
    msg.textContent = "checkpoint download not offered by this server";
  }
}

function openStream(id) {
  // EventSource resends Last-Event-ID itself when it reconnects after a network drop;
  // after `end` the server has nothing more, so the source is closed for good.
  const source = new EventSource(api.eventsUrl(id));
  const mine = () => detail && detail.id === id;
  source.addEventListener("progress", (ev) => {
    if (!mine()) return;
    const p = JSON.parse(ev.data);
    plot.add(p);
    showJob({ ...detail.job, progress: p, status: detail.job.status === "queued" ? "running" : detail.job.status });
  });
  source.addEventListener("status", (ev) => {
    if (!mine()) return;
    const s = JSON.parse(ev.data);
    showJob({ ...detail.job, status: s.status, error: s.error ?? detail.job.error, metrics: s.metrics ?? detail.job.metrics });
  });
  source.addEventListener("end", () => {
    source.close();
    if (mine()) onFinished(id);
  });
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED && mine()) {
      $("d-progress-text").textContent = "live updates lost; showing the last known state";
    }
  };
  return source;
}

function closeDetail() {
  if (!detail) return;
  detail.source?.close();
  detail.viewer?.dispose();
  detail.exports?.dispose();
  detail = null;
}

async function select(id) {
  if (detail && detail.id === id) return;
  closeDetail();
  selectedId = id;
  history.replaceState(null, "", `#job=${id}`);
  let job;
  try {
    job = await api.getJob(id);
  } catch (err) {
    $("jobs-msg").textContent = `job ${shortId(id)}: ${err.message}`;
    $("jobs-msg").className = "msg error";
    return;
  }
  if (selectedId !== id) return;
  detail = { id, job, source: null, viewer: null };
  $("placeholder").hidden = true;
  $("detail").hidden = false;
  $("viewer").replaceChildren();
  $("exports").replaceChildren();
  $("d-checkpoint").hidden = true;
  $("d-checkpoint-msg").textContent = "";
  plot.clear();
  plot.add(job.progress && job.progress.step ? job.progress : null);
  showJob(job);
  detail.source = openStream(id);
}

function setupDetail() {
  plot = new LossPlot($("plot"));
  $("d-cancel").addEventListener("click", async () => {
    if (!detail) return;
    try {
      showJob(await api.cancelJob(detail.id));
    } catch (err) {
      $("d-error").hidden = false;
      $("d-error").textContent = `cancel failed: ${err.message}`;
    }
  });
}

async function health() {
  const node = $("health");
  try {
    const r = await api.ready();
    node.textContent = r.ok ? "service ready" : `service not ready: ${r.body.detail ?? JSON.stringify(r.body)}`;
  } catch (err) {
    node.textContent = "service unreachable";
  }
}

function setupKey() {
  const input = $("api-key");
  input.value = api.apiKey();
  input.addEventListener("change", () => {
    api.setApiKey(input.value.trim());
    closeDetail();
    refreshList();
  });
}

setupKey();
setupUpload();
setupDetail();
health();
await refreshList();
setInterval(refreshList, LIST_EVERY_MS);
const fromHash = /job=([0-9a-f-]{36})/.exec(location.hash);
if (fromHash) select(fromHash[1]);
