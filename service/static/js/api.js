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

async function request(method, path, { json, form, signal } = {}) {
  const init = { method, signal, headers: {} };
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

// Returns a Blob (an image, or an animation / zip for paths).
export async function render(id, body, signal) {
  return (await request("POST", jobUrl(id, "/render"), { json: body, signal })).blob();
}

export async function renderPath(id, body, signal) {
  try {
    return (await request("POST", jobUrl(id, "/render/path"), { json: body, signal })).blob();
  } catch (err) {
    // `/render/path` is the documented route; servers from before it used `/render_path`.
    if (!(err instanceof ApiError) || !(err.status === 405 || (err.status === 404 && err.message === "Not Found"))) throw err;
    return (await request("POST", jobUrl(id, "/render_path"), { json: body, signal })).blob();
  }
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
    const resp = await fetch(url, { signal: ctrl.signal });
    return resp.ok;
  } catch (_) {
    return false;
  } finally {
    ctrl.abort();
  }
}
