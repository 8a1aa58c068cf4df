// Loss (log scale, left axis) and PSNR (right axis) against step, drawn on a canvas.

const LOSS = "#2f6fde";
const PSNR = "#e07a1f";

export class LossPlot {
  constructor(canvas) {
    this.canvas = canvas;
    this.points = new Map(); // step -> {step, loss, psnr}; repeats of a step overwrite
    new ResizeObserver(() => this.draw()).observe(canvas);
  }

  clear() {
    this.points.clear();
    this.draw();
  }

  add(p) {
    // Loss and PSNR come from training; the structure-from-motion stage counts percent.
    if (p == null || !Number.isFinite(p.step) || p.stage === "sfm") return;
    this.points.set(p.step, { step: p.step, loss: p.loss, psnr: p.psnr });
    this.scheduleDraw();
  }

  get size() {
    return this.points.size;
  }

  scheduleDraw() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  }

  draw() {
    const c = this.canvas;
    const pts = [...this.points.values()].sort((a, b) => a.step - b.step);
    c.dataset.points = String(pts.length); // how many steps are drawn, for tests and curious users
    const dpr = window.devicePixelRatio || 1;
    const W = c.clientWidth, H = c.clientHeight;
    if (!W || !H) return;
    c.width = Math.round(W * dpr);
    c.height = Math.round(H * dpr);
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, W, H);
    g.font = "11px system-ui, 'DejaVu Sans', sans-serif";

    const m = { l: 52, r: 48, t: 14, b: 26 };
    const pw = W - m.l - m.r, ph = H - m.t - m.b;
    if (pts.length === 0) {
      g.fillStyle = "#6b7280";
      g.textAlign = "center";
      g.fillText("waiting for training progress…", W / 2, H / 2);
      return;
    }

    const losses = pts.filter((p) => p.loss > 0);
    const psnrs = pts.filter((p) => Number.isFinite(p.psnr));
    const x0 = pts[0].step, x1 = Math.max(pts[pts.length - 1].step, x0 + 1);
    const X = (s) => m.l + ((s - x0) / (x1 - x0)) * pw;

    const range = (vals, pad) => {
      let lo = Math.min(...vals), hi = Math.max(...vals);
      if (hi - lo < 1e-9) { lo -= pad; hi += pad; }
      return [lo, hi];
    };
    const [l0, l1] = losses.length ? range(losses.map((p) => Math.log10(p.loss)), 0.5) : [0, 1];
    const [p0, p1] = psnrs.length ? range(psnrs.map((p) => p.psnr), 1) : [0, 1];
    const YL = (v) => m.t + (1 - (Math.log10(v) - l0) / (l1 - l0)) * ph;
    const YP = (v) => m.t + (1 - (v - p0) / (p1 - p0)) * ph;

    // frame and step ticks
    g.strokeStyle = "#e2e5ea";
    g.fillStyle = "#6b7280";
    g.lineWidth = 1;
    g.strokeRect(m.l, m.t, pw, ph);
    g.textAlign = "center";
    const ticks = new Set([0, 1, 2, 3, 4].map((i) => Math.round(x0 + ((x1 - x0) * i) / 4)));
    for (const s of ticks) {
      const x = X(s);
      g.beginPath(); g.moveTo(x, m.t); g.lineTo(x, m.t + ph); g.stroke();
      g.fillText(String(s), x, H - 8);
    }
    for (let i = 0; i <= 3; i++) {
      const y = m.t + (ph * i) / 3;
      g.beginPath(); g.moveTo(m.l, y); g.lineTo(m.l + pw, y); g.stroke();
      if (losses.length) {
        g.fillStyle = LOSS; g.textAlign = "right";
        g.fillText(fmtLoss(10 ** (l1 - ((l1 - l0) * i) / 3)), m.l - 4, y + 4);
      }
      if (psnrs.length) {
        g.fillStyle = PSNR; g.textAlign = "left";
        g.fillText((p1 - ((p1 - p0) * i) / 3).toFixed(1), m.l + pw + 4, y + 4);
      }
    }

    const line = (series, Y, color) => {
      if (!series.length) return;
      g.strokeStyle = color; g.lineWidth = 1.6;
      g.beginPath();
      series.forEach((p, i) => (i ? g.lineTo(X(p.step), Y(p)) : g.moveTo(X(p.step), Y(p))));
      g.stroke();
      if (series.length === 1) {
        g.fillStyle = color;
        g.beginPath(); g.arc(X(series[0].step), Y(series[0]), 2.5, 0, 2 * Math.PI); g.fill();
      }
    };
    line(losses, (p) => YL(p.loss), LOSS);
    line(psnrs, (p) => YP(p.psnr), PSNR);

    // legend with the latest values
    const last = pts[pts.length - 1];
    g.textAlign = "left";
    g.fillStyle = LOSS;
    g.fillText(`loss ${last.loss != null ? fmtLoss(last.loss) : "–"}`, m.l + 8, m.t + 14);
    g.fillStyle = PSNR;
    g.fillText(`PSNR ${Number.isFinite(last.psnr) ? last.psnr.toFixed(2) + " dB" : "–"}`, m.l + 90, m.t + 14);
  }
}

function fmtLoss(v) {
  return v >= 0.01 ? v.toFixed(3) : v.toExponential(1);
}
