// Exports of a finished scene job (meshes, point clouds, splat files): made on a worker, then
// offered as downloads. The formats are the server's (api_schemas/exports.py); docs/exports.md.

import * as api from "./api.js";
import { el } from "./dom.js";

const FORMATS = {
  nerf: [
    ["glb", "mesh, glTF binary (.glb)"],
    ["ply", "mesh, PLY (.ply)"],
    ["obj", "mesh, Wavefront (.obj)"],
    ["point_cloud", "point cloud (.ply)"],
  ],
  splat: [
    ["gaussians", "Gaussians, 3DGS PLY (.ply)"],
    ["splat", "web viewers (.splat)"],
    ["spz", "compressed, Niantic SPZ v4 (.spz)"],
    ["sog", "PlayCanvas SOG, WebP textures (.sog)"],
    ["compressed_ply", "SuperSplat compressed PLY (.compressed.ply)"],
    ["glb", "glTF, KHR_gaussian_splatting (.glb)"],
    ["mesh", "mesh fused from rendered depth (.glb)"],
    ["point_cloud", "point cloud (.ply)"],
  ],
};
const POLL_MS = 500;

export class ExportPanel {
  constructor(root, job) {
    this.job = job;
    this.disposed = false;
    const formats = FORMATS[job.kind] || [];
    this.select = el("select", { id: "export-format" }, formats.map(([v, label]) => el("option", { value: v }, label)));
    this.button = el("button", { type: "button", class: "secondary", id: "export-go" }, "Export");
    this.button.addEventListener("click", () => this.start());
    this.msg = el("span", { class: "muted", id: "export-msg" });
    this.list = el("ul", { id: "export-list", class: "exports" });
    root.replaceChildren(
      el("h3", {}, "Export"),
      el("div", { class: "controls" }, this.select, this.button, this.msg),
      this.list,
    );
    this.refresh();
  }

  async refresh() {
    try {
      const { items } = await api.listExports(this.job.id);
      if (!this.disposed) this.list.replaceChildren(...items.filter((e) => e.status === "succeeded").map((e) => this.link(e)));
    } catch (_) { /* a server without exports: the button will say why */ }
  }

  link(exp) {
    const name = exp.artifact;
    const a = el("a", { href: exp.url, download: name, "data-format": exp.format }, name);
    // links cannot send the key: fetch it with the key, hand the browser a blob URL
    a.addEventListener("click", async (ev) => {
      ev.preventDefault();
      try {
        const url = URL.createObjectURL(await api.download(exp.url));
        el("a", { href: url, download: name }).click();
        setTimeout(() => URL.revokeObjectURL(url), 60000);
      } catch (err) {
        this.msg.textContent = `download failed: ${err.message}`;
      }
    });
    const mb = exp.size != null ? ` (${(exp.size / 1e6).toFixed(2)} MB)` : "";
    return el("li", {}, a, mb);
  }

  async start() {
    const format = this.select.value;
    this.button.disabled = true;
    this.msg.className = "muted";
    this.msg.textContent = `exporting ${format} on a worker…`;
    try {
      let state = await api.createExport(this.job.id, { format });
      while (!this.disposed && (state.status === "queued" || state.status === "running")) {
        this.msg.textContent = `export ${state.status}…`;
        await new Promise((r) => setTimeout(r, POLL_MS));
        state = await api.getExport(this.job.id, state.id);
      }
      if (state.status !== "succeeded") throw new Error(state.error || state.status);
      this.msg.textContent = `${format} ready`;
      await this.refresh();
    } catch (err) {
      this.msg.textContent = `export failed: ${err.message}`;
      this.msg.className = "error";
    } finally {
      this.button.disabled = false;
    }
  }

  dispose() { this.disposed = true; }
}
