// Thin fetch wrappers: every failure becomes an Error whose message is the server's `detail`.

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function describeDetail(detail) {
  if (typeof detail === "string") return detail;
  // FastAPI validation errors: [{loc: [...], msg: "..."}]
  if (Array.isArray(detail)) {
    return detail.map((d) => (d.loc ? `${d.loc.filter((p) => p !== "body").join(".")}: ` : "") + (d.msg ?? JSON.stringify(d))).join("; ");
  }
  return JSON.stringify(detail);
}

async function failure(resp) {
  let message = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    if (body && body.detail !== undefined) message = describeDetail(body.detail);
  } catch (_) { /* not JSON: keep the status line */ }
  return new ApiError(resp.status, message);
}

// The API key lives in localStorage (set from the header field) and goes out as a bearer token.
const KEY_STORAGE = "nf.apiKey";

export function apiKey() {
  try { return localStorage.getItem(KEY_STORAGE) || ""; } catch (_) { return ""; }
}

export function setApiKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key); else localStorage.removeItem(KEY_STORAGE);
  } catch (_) { /* storage disabled: the key lasts for this page only */ }
}

export function authHeaders() {
  const key = apiKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function request(method, path, { json, form, signal } = {}) {
  const init = { method, signal, headers: authHeaders() };
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers["Content-Type"] = "application/json";
  } else if (form !== undefined) {
    init.body = form;
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, `service unreachable (${err.message})`);
  }
  if (!resp.ok) throw await failure(resp);
  return resp;
}

export const jobUrl = (id, suffix = "") => `/v1/jobs/${encodeURIComponent(id)}${suffix}`;

// EventSource cannot send headers; the events route alone accepts the key as ?access_token=.
export function eventsUrl(id) {
  const key = apiKey();
  return jobUrl(id, "/events") + (key ? `?access_token=${encodeURIComponent(key)}` : "");
}

// A file behind the API key as a Blob (links cannot send the Authorization header).
export async function download(url) {
  return (await request("GET", url)).blob();
}

export async function listJobs(limit = 50) {
  return (await request("GET", `/v1/jobs?limit=${limit}`)).json();
}

export async function getJob(id) {
  return (await request("GET", jobUrl(id))).json();
}

export async function submitJob(kind, file, configText) {
  const form = new FormData();
  form.append("kind", kind);
  form.append("dataset", file, file.name);
  if (configText && configText.trim()) form.append("config", configText.trim());
  return (await request("POST", "/v1/jobs", { form })).json();
}

export async function cancelJob(id) {
  return (await request("POST", jobUrl(id, "/cancel"))).json();
}

const sleep = (ms, signal) => new Promise((resolve, reject) => {
  const t = setTimeout(resolve, ms);
  signal?.addEventListener("abort", () => { clearTimeout(t); reject(new DOMException("aborted", "AbortError")); });
});

// A render job (202: a frame too large for one HTTP wait, or a path job) polled until its file
// is there; onProgress(state) after each poll (state.pixels_done / state.n_pixels for frames).
export async function waitRenderJob(state, { signal, onProgress } = {}) {
  while (state.status !== "succeeded") {
    if (state.status === "failed") throw new ApiError(500, state.error || "render failed");
    await sleep(500, signal);
    state = await (await request("GET", state.url, { signal })).json();
    onProgress?.(state);
  }
  const blob = await (await request("GET", state.artifact_url, { signal })).blob();
  blob.checkpointStep = state.checkpoint_step == null ? null : String(state.checkpoint_step);
  return blob;
}

// Returns a Blob (an image, or an animation / zip for paths).
export async function render(id, body, signal, onProgress) {
  const resp = await request("POST", jobUrl(id, "/render"), { json: body, signal });
  if (resp.status === 202) return waitRenderJob(await resp.json(), { signal, onProgress });
  const blob = await resp.blob();
  blob.checkpointStep = resp.headers.get("X-Checkpoint-Step"); // which training step it shows
  return blob;
}

export async function renderPath(id, body, signal, onProgress) {
  let resp;
  try {
    resp = await request("POST", jobUrl(id, "/render/path"), { json: body, signal });
  } catch (err) {
    // `/render/path` is the documented route; servers from before it used `/render_path`.
    if (!(err instanceof ApiError) || !(err.status === 405 || (err.status === 404 && err.message === "Not Found"))) throw err;
    resp = await request("POST", jobUrl(id, "/render_path"), { json: body, signal });
  }
  // a path over PATH_WAIT_PIXELS is answered 202 with a path job
  if (resp.status === 202) return waitRenderJob(await resp.json(), { signal, onProgress });
  return resp.blob();
}

// A camera path as a path job (mode "job"): its state (202), to follow with waitRenderJob.
export async function startPathJob(id, body, signal) {
  return (await request("POST", jobUrl(id, "/render/path"), { json: { ...body, mode: "job" }, signal })).json();
}

export async function ready() {
  const resp = await fetch("/readyz");
  let body = {};
  try { body = await resp.json(); } catch (_) { /* keep empty */ }
  return { ok: resp.ok, body };
}

// Whether a GET would succeed, without downloading the body (checkpoints can be large).
export async function available(url) {
  const ctrl = new AbortController();
  try {
    const resp = await fetch(url, { signal: ctrl.signal, headers: authHeaders() });
    return resp.ok;
  } catch (_) {
    return false;
  } finally {
    ctrl.abort();
  }
}

// Exports (meshes, point clouds, splat files) are made on a worker: POST answers the export's
// state (the same one again for the same format and options), GET follows it.
export async function createExport(id, body) {
  return (await request("POST", jobUrl(id, "/exports"), { json: body })).json();
}

export async function getExport(id, exportId) {
  return (await request("GET", jobUrl(id, `/exports/${encodeURIComponent(exportId)}`))).json();
}

export async function listExports(id) {
  return (await request("GET", jobUrl(id, "/exports"))).json();
}
