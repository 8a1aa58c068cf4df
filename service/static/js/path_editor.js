// Camera paths authored in the page: keyframes taken where the viewer looks, reordered,
// deleted, timed and given a field of view; previewed in the viewer; rendered as an H.264 MP4
// by a path job (POST render/path with mode "job", progress from its state); exported and
// imported as nerfstudio's camera_path.json (what its viewer writes and `ns-render` reads, and
// what the API's render/path takes: api_schemas/render.py NerfstudioCameraPath).
//
// The host viewer (viewer.js OrbitViewer, splat_viewer.js SplatViewer) provides:
//   pathView()              -> {c2w: 4x4 rows (world frame, OpenGL axes), fovX: degrees}
//   previewPose(c2w, fovX)  -> Promise, resolved once that pose is shown
//   endPreview()            -> back to the interactive view
//   pathSize()              -> [width, height] the path renders at by default

import * as api from "./api.js";
import { el } from "./dom.js";

const MAX_FRAMES = 720; // api_schemas/render.py: camera_path max_length
const PREVIEW_FRAMES_SERVER = 24; // a server-rendered preview shows at most this many frames
const DEG = Math.PI / 180;

// ---- pose maths ---------------------------------------------------------------------

const sub = (a, b) => a.map((v, i) => v - b[i]);
const cross = (a, b) => [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]];
const unit = (a) => { const l = Math.hypot(...a); return a.map((v) => v / l); };

// c2w (rows, OpenGL axes) of a camera at eye looking at target (as splat_viewer.js lookAt and
// worker/cameras.py look_at).
export function lookAtC2w(eye, target, up) {
  const fwd = unit(sub(target, eye));
  const right = unit(cross(fwd, up));
  const camUp = cross(right, fwd);
  return [
    [right[0], camUp[0], -fwd[0], eye[0]],
    [right[1], camUp[1], -fwd[1], eye[1]],
    [right[2], camUp[2], -fwd[2], eye[2]],
    [0, 0, 0, 1],
  ];
}

function quatFromC2w(m) {
  const [r00, r01, r02] = m[0], [r10, r11, r12] = m[1], [r20, r21, r22] = m[2];
  const tr = r00 + r11 + r22;
  let q;
  if (tr > 0) {
    const s = 2 * Math.sqrt(tr + 1);
    q = [s / 4, (r21 - r12) / s, (r02 - r20) / s, (r10 - r01) / s];
  } else if (r00 > r11 && r00 > r22) {
    const s = 2 * Math.sqrt(1 + r00 - r11 - r22);
    q = [(r21 - r12) / s, s / 4, (r01 + r10) / s, (r02 + r20) / s];
  } else if (r11 > r22) {
    const s = 2 * Math.sqrt(1 + r11 - r00 - r22);
    q = [(r02 - r20) / s, (r01 + r10) / s, s / 4, (r12 + r21) / s];
  } else {
    const s = 2 * Math.sqrt(1 + r22 - r00 - r11);
    q = [(r10 - r01) / s, (r02 + r20) / s, (r12 + r21) / s, s / 4];
  }
  return unit(q); // [w, x, y, z]
}

function c2wFromQuat([w, x, y, z], t) {
  return [
    [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y), t[0]],
    [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x), t[1]],
    [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y), t[2]],
    [0, 0, 0, 1],
  ];
}

function slerp(a, b, t) {
  let d = a.reduce((s, v, i) => s + v * b[i], 0);
  if (d < 0) { b = b.map((v) => -v); d = -d; }
  if (d > 0.9995) return unit(a.map((v, i) => v + t * (b[i] - v)));
  const th = Math.acos(d), s = Math.sin(th);
  const wa = Math.sin((1 - t) * th) / s, wb = Math.sin(t * th) / s;
  return a.map((v, i) => wa * v + wb * b[i]);
}

// Uniform Catmull-Rom through p1..p2 (p0, p3 the neighbours): the path passes every keyframe.
const catmullRom = (p0, p1, p2, p3, t) => p1.map((_, i) => 0.5 * (
  2 * p1[i] + (p2[i] - p0[i]) * t + (2 * p0[i] - 5 * p1[i] + 4 * p2[i] - p3[i]) * t * t
  + (3 * p1[i] - p0[i] - 3 * p2[i] + p3[i]) * t * t * t));

const position = (c2w) => [c2w[0][3], c2w[1][3], c2w[2][3]];

// `n` frames along the keyframes (each {c2w, fovX}), the first and last on the end keyframes:
// positions on a Catmull-Rom spline, rotations slerped, the field of view linear, every
// segment between two keyframes the same share of the time.
export function samplePath(keys, n) {
  if (!keys.length) return [];
  if (keys.length === 1) return Array.from({ length: n }, () => ({ c2w: keys[0].c2w, fovX: keys[0].fovX }));
  const pos = keys.map((k) => position(k.c2w));
  const quats = keys.map((k) => quatFromC2w(k.c2w));
  const last = keys.length - 1;
  const out = [];
  for (let i = 0; i < n; i++) {
    const u = n === 1 ? 0 : (i / (n - 1)) * last;
    const s = Math.min(Math.floor(u), last - 1);
    const t = u - s;
    const p = catmullRom(pos[Math.max(0, s - 1)], pos[s], pos[s + 1], pos[Math.min(last, s + 2)], t);
    out.push({ c2w: c2wFromQuat(slerp(quats[s], quats[s + 1], t), p), fovX: keys[s].fovX + t * (keys[s + 1].fovX - keys[s].fovX) });
  }
  return out;
}

// nerfstudio's `fov` is vertical; the page's viewers (and fov_x_deg) horizontal.
export const fovYFromX = (fovX, aspect) => 2 * Math.atan(Math.tan((fovX * DEG) / 2) / aspect) / DEG;
export const fovXFromY = (fovY, aspect) => 2 * Math.atan(Math.tan((fovY * DEG) / 2) * aspect) / DEG;

const flat = (c2w) => c2w.flat();

// A keyframe's or camera's matrix as nerfstudio writes it: 16 numbers row-major (its viser
// viewer), a JSON string of them (its older viewer: THREE.js's column-major elements), or rows.
export function matrixRows(value) {
  let m = typeof value === "string" ? JSON.parse(value) : value;
  if (Array.isArray(m) && Array.isArray(m[0])) m = m.flat();
  if (!Array.isArray(m) || m.length !== 16 || !m.every((v) => Number.isFinite(Number(v)))) {
    throw new Error("a camera matrix is not 16 numbers");
  }
  m = m.map(Number);
  const rowMajor = Math.abs(m[12]) + Math.abs(m[13]) + Math.abs(m[14]) < 1e-9 && Math.abs(m[15] - 1) < 1e-9;
  const colMajor = Math.abs(m[3]) + Math.abs(m[7]) + Math.abs(m[11]) < 1e-9 && Math.abs(m[15] - 1) < 1e-9;
  if (!rowMajor && colMajor) m = [0, 1, 2, 3].flatMap((r) => [0, 1, 2, 3].map((c) => m[4 * c + r]));
  return [0, 1, 2, 3].map((r) => m.slice(4 * r, 4 * r + 4));
}

// ---- the editor ---------------------------------------------------------------------

const even = (v) => Math.max(2, 2 * Math.floor(Number(v) / 2));
const fmt = (v) => (Math.abs(v) < 1e-9 ? "0" : Number(v.toPrecision(3)).toString());

export class PathEditor {
  constructor(root, job, viewer) {
    this.job = job;
    this.viewer = viewer;
    this.keys = []; // {c2w, fovX}
    this.disposed = false;
    this.ctrl = null;
    root.nfPaths = this; // scripts and tests reach the editor through its element
    const [w, h] = viewer.pathSize().map(even);

    const num = (id, value, attrs = {}) => el("input", { id, type: "number", value: String(value), ...attrs });
    this.seconds = num("path-seconds", 4, { min: "0.1", max: "120", step: "0.1" });
    this.fps = num("path-fps", 24, { min: "1", max: "60", step: "1" });
    this.width = num("path-width", w, { min: "2", max: "4096", step: "2" });
    this.height = num("path-height", h, { min: "2", max: "4096", step: "2" });
    this.fov = num("path-fov", Math.round(viewer.pathView().fovX), { min: "5", max: "150", step: "1", title: "horizontal field of view of keyframes added next" });
    this.list = el("ol", { id: "path-keyframes", class: "keyframes" });
    this.bar = el("div", { class: "bar", id: "path-bar" });
    this.msg = el("span", { class: "muted", id: "path-msg" }, "no keyframes yet: move the view, then add one");
    this.result = el("div", { id: "path-result", class: "controls" });
    const button = (id, text, fn) => {
      const b = el("button", { type: "button", class: "secondary", id }, text);
      b.addEventListener("click", fn);
      return b;
    };
    this.addBtn = button("path-add", "Add keyframe (this view)", () => this.add());
    this.previewBtn = button("path-preview", "Preview", () => this.preview());
    this.renderBtn = button("path-render", "Render MP4", () => this.render());
    this.exportBtn = button("path-export", "Export camera_path.json", () => this.exportFile());
    this.importIn = el("input", { type: "file", id: "path-import", accept: ".json,application/json" });
    this.importIn.addEventListener("change", () => this.importFile());
    for (const input of [this.seconds, this.fps, this.width, this.height]) input.addEventListener("change", () => this.update());
    // the keyframe fov follows the viewer's until the editor's own is set
    this.fov.addEventListener("change", () => { this.fovSet = true; });

    root.replaceChildren(
      el("h3", {}, "Camera path"),
      el("div", { class: "controls" }, this.addBtn, el("label", {}, "fov° ", this.fov),
        el("label", {}, "duration s ", this.seconds), el("label", {}, "fps ", this.fps),
        el("label", {}, "size ", this.width, "×", this.height)),
      this.list,
      el("div", { class: "controls" }, this.previewBtn, this.renderBtn, this.exportBtn,
        el("label", { class: "button secondary" }, "Import camera_path.json", this.importIn)),
      el("div", { class: "progress" }, this.bar),
      el("div", { class: "controls" }, this.msg),
      this.result,
    );
    this.importIn.hidden = true;
    this.update();
  }

  size() { return [even(this.width.value), even(this.height.value)]; }

  nFrames() {
    const n = Math.round(Number(this.seconds.value) * Number(this.fps.value));
    return Math.max(1, Math.min(MAX_FRAMES, Number.isFinite(n) ? n : 1));
  }

  add() {
    const { c2w, fovX } = this.viewer.pathView();
    this.keys.push({ c2w: c2w.map((r) => r.slice()), fovX: this.fovSet ? Number(this.fov.value) : fovX });
    this.update();
  }

  move(i, d) {
    const j = i + d;
    if (j < 0 || j >= this.keys.length) return;
    [this.keys[i], this.keys[j]] = [this.keys[j], this.keys[i]];
    this.update();
  }

  remove(i) {
    this.keys.splice(i, 1);
    this.update();
  }

  // The list, and which actions make sense now.
  update() {
    if (!this.fovSet) this.fov.value = String(Math.round(this.viewer.pathView().fovX));
    this.list.replaceChildren(...this.keys.map((k, i) => {
      const fovIn = el("input", { type: "number", class: "kf-fov", min: "5", max: "150", step: "1", value: String(+k.fovX.toFixed(2)), title: "horizontal field of view, degrees" });
      fovIn.addEventListener("change", () => { const v = Number(fovIn.value); if (v > 0 && v < 180) k.fovX = v; });
      const small = (cls, text, title, fn) => {
        const b = el("button", { type: "button", class: `secondary ${cls}`, title }, text);
        b.addEventListener("click", fn);
        return b;
      };
      const first = small("kf-up", "↑", "earlier", () => this.move(i, -1));
      const later = small("kf-down", "↓", "later", () => this.move(i, 1));
      first.disabled = i === 0;
      later.disabled = i === this.keys.length - 1;
      return el("li", { "data-index": String(i) },
        el("code", {}, `eye ${position(k.c2w).map(fmt).join(", ")}`),
        el("label", {}, "fov° ", fovIn),
        small("kf-show", "show", "show this keyframe in the viewer", () => this.show(i)),
        first, later,
        small("kf-delete", "✕", "delete", () => this.remove(i)));
    }));
    const none = this.keys.length === 0;
    this.previewBtn.disabled = none || this.busy;
    this.renderBtn.disabled = none || this.busy;
    this.exportBtn.disabled = none;
    if (!this.busy) {
      const [w, h] = this.size();
      this.msg.textContent = none ? "no keyframes yet: move the view, then add one"
        : `${this.keys.length} keyframe${this.keys.length > 1 ? "s" : ""} · ${this.nFrames()} frames at ${w}×${h}`;
      this.msg.className = "muted";
    }
  }

  // ---- nerfstudio's camera_path.json ----

  toJson() {
    const [w, h] = this.size();
    const aspect = w / h;
    const frames = samplePath(this.keys, this.nFrames());
    return {
      camera_type: "perspective",
      render_width: w,
      render_height: h,
      fps: Number(this.fps.value),
      seconds: Number(this.seconds.value),
      smoothness_value: 0.5,
      is_cycle: false,
      keyframes: this.keys.map((k) => ({ matrix: flat(k.c2w), fov: fovYFromX(k.fovX, aspect), aspect })),
      camera_path: frames.map((f) => ({ camera_to_world: flat(f.c2w), fov: fovYFromX(f.fovX, aspect), aspect })),
      // not nerfstudio's: the poses are in this dataset's own world frame (render/path's `frame`)
      frame: "world",
    };
  }

  fromJson(data) {
    if (!data || typeof data !== "object") throw new Error("not a JSON object");
    const w = Number(data.render_width), h = Number(data.render_height);
    const aspectOf = (entry) => Number(entry.aspect) || (w > 0 && h > 0 ? w / h : 1);
    const source = Array.isArray(data.keyframes) && data.keyframes.length ? data.keyframes.map((k) => [k.matrix, k])
      : Array.isArray(data.camera_path) ? data.camera_path.map((c) => [c.camera_to_world, c]) : [];
    if (!source.length) throw new Error("no keyframes and no camera_path in the file");
    const fallback = this.viewer.pathView().fovX;
    this.keys = source.map(([m, entry]) => ({
      c2w: matrixRows(m),
      fovX: Number(entry.fov) > 0 ? fovXFromY(Number(entry.fov), aspectOf(entry)) : fallback,
    }));
    if (w > 0 && h > 0) { this.width.value = String(even(w)); this.height.value = String(even(h)); }
    const fps = Number(data.fps) > 0 ? Number(data.fps) : 24;
    this.fps.value = String(Math.max(1, Math.min(60, Math.round(fps))));
    const n = Array.isArray(data.camera_path) ? data.camera_path.length : 0;
    const seconds = Number(data.seconds) > 0 ? Number(data.seconds) : n ? n / fps : 4;
    this.seconds.value = String(seconds);
    this.update();
  }

  exportFile() {
    const blob = new Blob([JSON.stringify(this.toJson(), null, 2)], { type: "application/json" });
    const url = URL.createObjectURL(blob);
    el("a", { href: url, download: "camera_path.json" }).click();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  }

  async importFile() {
    const file = this.importIn.files[0];
    if (!file) return;
    try {
      this.fromJson(JSON.parse(await file.text()));
      this.msg.textContent = `imported ${file.name}: ${this.keys.length} keyframes · ${this.nFrames()} frames`;
      this.msg.className = "msg ok";
    } catch (err) {
      this.msg.textContent = `import failed: ${err.message}`;
      this.msg.className = "error";
    } finally {
      this.importIn.value = "";
    }
  }

  // ---- preview and render ----

  setBusy(busy) {
    this.busy = busy;
    this.addBtn.disabled = busy;
    this.update();
  }

  async show(i) {
    const k = this.keys[i];
    if (k) await this.viewer.previewPose(k.c2w, k.fovX);
  }

  // Plays the path in the viewer: every frame at the path's fps where the viewer draws in the
  // browser, a few frames rendered small by the server where it does not.
  async preview() {
    if (this.busy || !this.keys.length) return;
    this.setBusy(true);
    const total = this.nFrames();
    const n = this.viewer.drawsLocally ? total : Math.min(total, PREVIEW_FRAMES_SERVER);
    const frames = samplePath(this.keys, n);
    const frameMs = (1000 * Number(this.seconds.value)) / n;
    this.previewing = true;
    try {
      for (let i = 0; i < frames.length && this.previewing && !this.disposed; i++) {
        const t0 = performance.now();
        await this.viewer.previewPose(frames[i].c2w, frames[i].fovX);
        this.msg.textContent = `preview ${i + 1}/${n}`;
        this.msg.className = "muted";
        this.bar.style.width = `${Math.round((100 * (i + 1)) / n)}%`;
        const left = frameMs - (performance.now() - t0);
        if (left > 0) await new Promise((r) => setTimeout(r, left));
      }
      this.msg.dataset.previewed = String(n);
    } catch (err) {
      this.msg.textContent = `preview failed: ${err.message}`;
      this.msg.className = "error";
      return;
    } finally {
      this.previewing = false;
      this.setBusy(false);
      if (!this.disposed) this.viewer.endPreview();
    }
  }

  // The path as a path job: its progress from the job's state, the MP4 offered once it lands.
  async render() {
    if (this.busy || !this.keys.length) return;
    const cp = this.toJson();
    delete cp.frame;
    const body = { camera_path: cp, frame: "world", format: "mp4", fps: Math.round(cp.fps) };
    this.setBusy(true);
    this.ctrl = new AbortController();
    this.result.replaceChildren();
    this.bar.style.width = "0%";
    const n = cp.camera_path.length;
    this.msg.textContent = `rendering ${n} frames at ${cp.render_width}×${cp.render_height}…`;
    const progress = (state) => {
      this.msg.dataset.renderId = state.id;
      this.msg.dataset.status = state.status;
      this.bar.style.width = `${Math.round((100 * (state.frames_done || 0)) / (state.n_frames || n))}%`;
      this.msg.textContent = `path job ${state.status}: ${state.frames_done || 0}/${state.n_frames || n} frames`;
    };
    try {
      const state = await api.startPathJob(this.job.id, body, this.ctrl.signal);
      progress(state);
      const blob = await api.waitRenderJob(state, { signal: this.ctrl.signal, onProgress: progress });
      if (this.disposed) return;
      if (this.url) URL.revokeObjectURL(this.url);
      this.url = URL.createObjectURL(blob);
      const step = blob.checkpointStep ? ` (checkpoint step ${blob.checkpointStep})` : "";
      this.bar.style.width = "100%";
      this.msg.dataset.status = "succeeded";
      this.msg.textContent = `${n} frames rendered${step}`;
      this.msg.className = "msg ok";
      this.result.replaceChildren(el("a", { class: "button", id: "path-download", href: this.url, download: `${this.job.id}-path.mp4` },
        `Download MP4 (${(blob.size / 1e6).toFixed(2)} MB)`));
    } catch (err) {
      if (err.name === "AbortError") return;
      this.msg.dataset.status = "failed";
      this.msg.textContent = `path render failed: ${err.message}`;
      this.msg.className = "error";
    } finally {
      this.ctrl = null;
      this.busy = false;
      this.addBtn.disabled = false;
      this.previewBtn.disabled = !this.keys.length;
      this.renderBtn.disabled = !this.keys.length;
    }
  }

  dispose() {
    this.disposed = true;
    this.previewing = false;
    this.ctrl?.abort();
    if (this.url) URL.revokeObjectURL(this.url);
  }
}
