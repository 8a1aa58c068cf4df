// Viewers for finished jobs (and scene jobs while they train): the image field at a chosen size,
// and an orbit camera for scene kinds that asks the render endpoint for frames (small while
// moving, full when still).

import * as api from "./api.js";
import { el } from "./dom.js";
import { PathEditor, lookAtC2w } from "./path_editor.js";

const IDLE_MS = 250;     // still this long → ask for the full-resolution frame
const LOW_DIVISOR = 4;   // low-res frames while dragging are this much smaller per side
const MAX_SIDE = 512;

// An <img> whose blob URL is released when replaced.
class Frame {
  constructor(alt) {
    this.img = el("img", { id: "frame", alt, draggable: "false" });
    this.url = null;
  }
  show(blob) {
    const url = URL.createObjectURL(blob);
    this.img.src = url;
    if (this.url) URL.revokeObjectURL(this.url);
    this.url = url;
  }
  dispose() {
    if (this.url) URL.revokeObjectURL(this.url);
    this.url = null;
  }
}

function num(v) {
  return typeof v === "number" && Number.isFinite(v) && v > 0 ? v : null;
}

// Width/height of the training data, from whatever intake recorded.
export function datasetSize(job) {
  const d = job.dataset || {};
  const pairs = [[d.width, d.height], [d.w, d.h], [d.train_width, d.train_height],
                 [d.original_width, d.original_height]];
  for (const [w, h] of pairs) if (num(w) && num(h)) return [w, h];
  if (Array.isArray(d.size) && num(d.size[0]) && num(d.size[1])) return [d.size[0], d.size[1]];
  if (Array.isArray(d.frames) && d.frames[0] && num(d.frames[0].w)) return [d.frames[0].w, d.frames[0].h];
  // nerf intake: "sizes": ["800x800", ...]
  const m = Array.isArray(d.sizes) && /^(\d+)x(\d+)$/.exec(String(d.sizes[0]));
  if (m) return [Number(m[1]), Number(m[2])];
  const r = num((job.config || {}).resolution) || 64;
  return [r, r];
}

export function fitSize([w, h], longest) {
  const s = longest / Math.max(w, h);
  return [Math.max(1, Math.round(w * s)), Math.max(1, Math.round(h * s))];
}

export class ImageViewer {
  constructor(root, job) {
    this.job = job;
    this.frame = new Frame("rendered field");
    this.msg = el("span", { class: "muted", id: "frame-msg" });
    const [tw, th] = datasetSize(job);
    const train = fitSize([tw, th], num(job.config?.resolution) || Math.max(tw, th));
    this.sizes = [
      ["training size", train],
      ["4× (the field is continuous)", [train[0] * 4, train[1] * 4]],
      ["512 px", fitSize(train, 512)],
    ];
    this.select = el("select", { id: "frame-size" },
      this.sizes.map(([label, [w, h]], i) => el("option", { value: String(i) }, `${label}: ${w}×${h}`)));
    this.select.value = "1";
    this.select.addEventListener("change", () => this.render());
    this.download = el("a", { class: "button secondary", download: `${job.id}.png`, hidden: "" }, "Download frame");
    root.replaceChildren(
      el("h3", {}, "Rendered field"),
      el("div", { class: "controls" }, el("label", {}, "Size ", this.select), this.download, this.msg),
      el("div", { class: "stage" }, this.frame.img),
    );
    this.render();
  }

  async render() {
    const [width, height] = this.sizes[Number(this.select.value)][1];
    const t0 = performance.now();
    this.msg.textContent = `rendering ${width}×${height}…`;
    this.msg.className = "muted";
    try {
      const blob = await api.render(this.job.id, { width, height }, undefined, (job) => {
        this.msg.textContent = `rendering ${width}×${height}… ${progressText(job)}`;
      });
      this.frame.show(blob);
      // small fields are shown enlarged (the browser interpolates); the file keeps its size
      this.frame.img.style.width = `${Math.max(width, Math.min(384, 4 * width))}px`;
      this.download.href = this.frame.url;
      this.download.hidden = false;
      this.msg.textContent = `${width}×${height} in ${Math.round(performance.now() - t0)} ms`;
    } catch (err) {
      this.msg.textContent = `render failed: ${err.message}`;
      this.msg.className = "error";
    }
  }

  dispose() { this.frame.dispose(); }
}

// ---- orbit camera -------------------------------------------------------------------

const sub = (a, b) => a.map((v, i) => v - b[i]);
const add = (a, b) => a.map((v, i) => v + b[i]);
const scale = (a, s) => a.map((v) => v * s);
const dot = (a, b) => a.reduce((s, v, i) => s + v * b[i], 0);
const cross = (a, b) => [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]];
const norm = (a) => scale(a, 1 / Math.hypot(...a));

export const UPS = { "+z": [0, 0, 1], "+y": [0, 1, 0], "-y": [0, -1, 0] };

// Starting view from what intake recorded: look at the normalisation centre from outside
// the unit box, as the training cameras do.
export function initialOrbit(job) {
  const d = job.dataset || {};
  const n = d.normalization || {};
  const target = Array.isArray(n.offset) && n.offset.length === 3 ? n.offset.map(Number) : [0, 0, 0];
  const s = num(n.scale) || 0.25;
  const upKey = d.source_format === "colmap" ? "-y" : "+z";
  let fov = 40;
  if (num(d.camera_angle_x)) fov = (d.camera_angle_x * 180) / Math.PI;
  else if (num(d.fov_x_deg)) fov = d.fov_x_deg;
  return { target, radius: 3 / s, azimuth: 0.6, elevation: 0.45, upKey, fov };
}

// A render job's progress (frames render in bands of rows on the server) as "42 %".
function progressText(job) {
  if (job.n_pixels) return `${Math.floor((100 * (job.pixels_done || 0)) / job.n_pixels)} %`;
  return job.n_frames ? `${job.frames_done}/${job.n_frames} frames` : "";
}

export class OrbitViewer {
  constructor(root, job) {
    this.job = job;
    this.o = initialOrbit(job);
    const [w, h] = datasetSize(job);
    // full resolution = the training images', capped: CPU render workers take seconds per 800²
    this.full = fitSize([w, h], Math.min(MAX_SIDE, Math.max(w, h)));
    this.output = "rgb";
    this.version = 0;
    this.shown = { version: -1, full: false };
    this.inflight = false;
    // -Infinity, not 0: performance.now() starts at page load, so a viewer made in the first
    // IDLE_MS would otherwise take its first, still view for a drag and ask for small frames
    this.lastChange = -Infinity;
    this.disposed = false;

    this.frame = new Frame("rendered view");
    this.hud = el("span", { class: "hud", id: "hud" }, "");
    this.msg = el("span", { class: "muted", id: "frame-msg" });
    this.stage = el("div", { class: "stage orbit", title: "drag or arrow keys to orbit, scroll or +/- to zoom" }, this.frame.img, this.hud);
    // shown at least 400 px wide: frames from small datasets are enlarged, not requested larger
    this.stage.style.width = `${Math.max(this.full[0], 400)}px`;
    this.stage.style.aspectRatio = `${this.full[0]} / ${this.full[1]}`;
    this.frame.img.style.width = "100%";

    const outputs = ["rgb", "depth", "alpha"].map((o) => {
      const input = el("input", { type: "radio", name: "output", value: o });
      if (o === this.output) input.checked = true;
      input.addEventListener("change", () => { this.output = o; this.changed(false); });
      return el("label", {}, input, o);
    });
    const upSel = el("select", { id: "orbit-up" }, Object.keys(UPS).map((k) => el("option", { value: k }, `up ${k}`)));
    upSel.value = this.o.upKey;
    upSel.addEventListener("change", () => { this.o.upKey = upSel.value; this.changed(false); });
    const fovIn = el("input", { type: "number", min: "5", max: "150", step: "1", value: String(Math.round(this.o.fov)) });
    fovIn.addEventListener("change", () => { const v = Number(fovIn.value); if (v > 0 && v < 180) { this.o.fov = v; this.changed(false); } });
    const targetIn = el("input", { type: "text", size: "14", value: this.o.target.map((v) => +v.toFixed(3)).join(", ") });
    targetIn.addEventListener("change", () => {
      const t = targetIn.value.split(/[ ,]+/).filter(Boolean).map(Number);
      if (t.length === 3 && t.every(Number.isFinite)) { this.o.target = t; this.changed(false); }
    });
    this.animBtn = el("button", { type: "button", class: "secondary", id: "orbit-animation" }, "Make orbit animation");
    this.animBtn.addEventListener("click", () => this.animation());
    const camsBtn = el("button", { type: "button", class: "secondary", id: "training-cameras" }, "Download training cameras (camera_path.json)");
    camsBtn.addEventListener("click", () => this.downloadCameras());
    this.anim = el("div", { class: "animation" });
    const pathRoot = el("div", { id: "path-editor", class: "path-editor" });

    root.replaceChildren(
      el("h3", {}, "Viewer"),
      el("div", { class: "controls" }, ...outputs, upSel, el("label", {}, "fov° ", fovIn), el("label", {}, "target ", targetIn)),
      this.stage,
      el("div", { class: "controls" }, this.msg),
      el("div", { class: "controls" }, this.animBtn, camsBtn),
      this.anim,
      pathRoot,
    );
    this.paths = new PathEditor(pathRoot, job, this);
    this.bindPointer();
    this.changed(false);
  }

  eye() {
    const up = UPS[this.o.upKey];
    // any axis not parallel to `up` gives the horizontal basis
    const seed = Math.abs(up[0]) < 0.9 ? [1, 0, 0] : [0, 1, 0];
    const a = norm(sub(seed, scale(up, dot(seed, up))));
    const b = cross(up, a);
    const { azimuth: az, elevation: e, radius: r } = this.o;
    const dir = add(scale(add(scale(a, Math.cos(az)), scale(b, Math.sin(az))), Math.cos(e)), scale(up, Math.sin(e)));
    return add(this.o.target, scale(dir, r));
  }

  // Render request fields for the current view (issue 5: `camera` plus intrinsics beside it).
  view() {
    return { camera: { look_at: { eye: this.eye(), target: this.o.target, up: UPS[this.o.upKey] } }, fov_x_deg: this.o.fov };
  }

  // ---- for the camera path editor (path_editor.js) ----

  pathView() {
    return { c2w: lookAtC2w(this.eye(), this.o.target, UPS[this.o.upKey]), fovX: this.o.fov };
  }

  pathSize() { return this.full; }

  // One small frame of a path pose, rendered by the server and shown in the stage.
  async previewPose(c2w, fovX) {
    const [fw, fh] = this.full;
    const width = Math.max(16, Math.round(fw / LOW_DIVISOR)), height = Math.max(16, Math.round(fh / LOW_DIVISOR));
    const blob = await api.render(this.job.id, { width, height, output: this.output, camera: { c2w }, fov_x_deg: fovX });
    if (this.disposed) return;
    this.frame.show(blob);
    this.hud.textContent = `path preview ${width}×${height}`;
  }

  endPreview() { this.changed(false); } // the interactive view again, at full size

  bindPointer() {
    let last = null;
    this.stage.addEventListener("pointerdown", (ev) => {
      last = [ev.clientX, ev.clientY];
      this.stage.setPointerCapture(ev.pointerId);
      this.stage.classList.add("dragging");
    });
    this.stage.addEventListener("pointermove", (ev) => {
      if (!last) return;
      const dx = ev.clientX - last[0], dy = ev.clientY - last[1];
      last = [ev.clientX, ev.clientY];
      this.o.azimuth -= dx * 0.01;
      this.o.elevation = Math.max(-1.5, Math.min(1.5, this.o.elevation + dy * 0.01));
      this.changed(true);
    });
    const end = () => { last = null; this.stage.classList.remove("dragging"); };
    this.stage.addEventListener("pointerup", end);
    this.stage.addEventListener("pointercancel", end);
    // Keyboard too: arrows orbit, +/- zoom (focus the view first; it takes Tab).
    this.stage.tabIndex = 0;
    this.stage.addEventListener("keydown", (ev) => {
      const o = this.o;
      const moves = {
        ArrowLeft: () => { o.azimuth += 0.1; }, ArrowRight: () => { o.azimuth -= 0.1; },
        ArrowUp: () => { o.elevation = Math.min(1.5, o.elevation + 0.1); },
        ArrowDown: () => { o.elevation = Math.max(-1.5, o.elevation - 0.1); },
        "+": () => { o.radius /= 1.1; }, "=": () => { o.radius /= 1.1; }, "-": () => { o.radius *= 1.1; },
      };
      if (!moves[ev.key]) return;
      ev.preventDefault();
      moves[ev.key]();
      this.changed(true);
    });
    this.stage.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      this.o.radius = Math.max(1e-3, this.o.radius * Math.exp(ev.deltaY * 0.001));
      this.changed(true);
    }, { passive: false });
  }

  changed(moving) {
    this.version += 1;
    this.lastChange = moving ? performance.now() : -Infinity;
    this.pump();
    if (moving) {
      clearTimeout(this.idleTimer);
      this.idleTimer = setTimeout(() => this.pump(), IDLE_MS + 20);
    }
  }

  // One request in flight at a time; when it lands, ask again if the view moved meanwhile,
  // or for full resolution once the view has been still for IDLE_MS.
  pump() {
    if (this.inflight || this.disposed) return;
    const moving = performance.now() - this.lastChange < IDLE_MS;
    const fresh = this.shown.version === this.version;
    if (moving ? fresh : fresh && this.shown.full) return;
    const version = this.version;
    const full = !moving;
    const [fw, fh] = this.full;
    const [width, height] = full ? [fw, fh]
      : [Math.max(16, Math.round(fw / LOW_DIVISOR)), Math.max(16, Math.round(fh / LOW_DIVISOR))];
    const t0 = performance.now();
    this.inflight = true;
    api.render(this.job.id, { width, height, output: this.output, ...this.view() }, undefined, (job) => {
      this.msg.textContent = `rendering ${width}×${height}… ${progressText(job)}`;
      this.msg.className = "muted";
    })
      .then((blob) => {
        if (this.disposed) return;
        this.frame.show(blob);
        this.shown = { version, full };
        const step = blob.checkpointStep ? ` · step ${blob.checkpointStep}` : "";
        this.hud.textContent = `${this.output} ${width}×${height} · ${Math.round(performance.now() - t0)} ms${step}`;
        this.msg.textContent = "drag to orbit, scroll to zoom";
        this.msg.className = "muted";
      })
      .catch((err) => {
        this.shown = { version, full: true }; // don't retry the same view in a loop
        this.msg.textContent = `render failed: ${err.message}`;
        this.msg.className = "error";
      })
      .finally(() => { this.inflight = false; this.pump(); });
  }

  async animation() {
    const [fw, fh] = this.full;
    const [width, height] = fitSize([fw, fh], Math.min(400, Math.max(fw, fh)));
    const body = {
      orbit: { center: this.o.target, radius: this.o.radius, elevation_deg: (this.o.elevation * 180) / Math.PI,
               n_frames: 36, up: UPS[this.o.upKey] },
      fov_x_deg: this.o.fov, width, height, output: this.output, format: "webp",
    };
    this.animBtn.disabled = true;
    this.anim.replaceChildren(el("span", { class: "muted" }, `rendering ${body.orbit.n_frames} frames at ${width}×${height}…`));
    try {
      const blob = await api.renderPath(this.job.id, body);
      const url = URL.createObjectURL(blob);
      const isZip = (blob.type || "").includes("zip");
      const ext = isZip ? "zip" : (blob.type.split("/")[1] || "webp");
      const parts = [el("a", { class: "button secondary", href: url, download: `${this.job.id}-orbit.${ext}` }, `Download orbit (.${ext})`)];
      if (!isZip) parts.unshift(el("img", { src: url, alt: "orbit animation" }));
      this.anim.replaceChildren(...parts);
    } catch (err) {
      this.anim.replaceChildren(el("span", { class: "error" }, `orbit animation failed: ${err.message}`));
    } finally {
      this.animBtn.disabled = false;
    }
  }

  // A newer checkpoint of a running job: show the same view from it.
  checkpointLanded(step) {
    if (step === this.checkpointStep) return;
    const first = this.checkpointStep === undefined;
    this.checkpointStep = step;
    if (!first) this.changed(false);
  }

  // The training cameras as nerfstudio's camera_path.json (world frame), to edit and send back.
  async downloadCameras() {
    try {
      const blob = await api.download(api.jobUrl(this.job.id, "/camera_path"));
      const url = URL.createObjectURL(blob);
      el("a", { href: url, download: `${this.job.id}-camera_path.json` }).click();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    } catch (err) {
      this.anim.replaceChildren(el("span", { class: "error" }, `camera download failed: ${err.message}`));
    }
  }

  dispose() {
    this.disposed = true;
    this.paths?.dispose();
    clearTimeout(this.idleTimer);
    this.frame.dispose();
  }
}

export function makeViewer(root, job) {
  return job.kind === "image" ? new ImageViewer(root, job) : new OrbitViewer(root, job);
}
