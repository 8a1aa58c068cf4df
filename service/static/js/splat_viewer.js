// Splat jobs in the browser: the job's `.spz` export (Niantic's compressed format: version 4's ZSTD
// streams inflated by the vendored fzstd, versions 2-3 gunzipped with the browser's
// DecompressionStream) drawn with WebGL2 on the client, so orbiting needs no server round trip.
// The job's other splat files parse too: `.splat` (antimatter15/splat's layout), SuperSplat's
// `.compressed.ply`, glTF with KHR_gaussian_splatting (`.glb`) and PlayCanvas' SOG (`.sog`, its
// WebP textures decoded by the browser and read back through WebGL so no byte is premultiplied);
// the viewer's "file" menu chooses which export it draws.
//
// The projection and compositing follow the server's rasteriser (kernels/splat_project.py,
// kernels/splat.py): EWA projection with the Jacobian's view direction clamped to 1.3x the half
// field of view, a 0.3 px^2 dilation, alpha = min(0.99, o * exp(-d^T conic d / 2)), splats under
// 1/255 skipped, sorted by view depth and blended back to front over the background; a file
// flagged antialiased (trained with mip-splatting's filter) has each opacity scaled by
// sqrt(det(cov2d) / det(cov2d + 0.3 I)) as the server does. What the viewer drops is
// view-dependent colour (only the SH DC band is drawn) and precision (8-bit colour and opacity).

import * as api from "./api.js";
import { el } from "./dom.js";
import { PathEditor } from "./path_editor.js";
import { decompress as zstdDecompress } from "./fzstd.js";
import { datasetSize, fitSize, initialOrbit, UPS } from "./viewer.js";

export const BYTES_PER_SPLAT = 32;
const MAX_SIDE = 512;

// ---- the file ------------------------------------------------------------------------

// .splat bytes -> centres (3n), 3D covariances (6n: xx xy xz yy yz zz) and packed RGBA (n).
export function parseSplat(buffer) {
  if (buffer.byteLength % BYTES_PER_SPLAT) throw new Error(".splat size is not a multiple of 32 bytes");
  const n = buffer.byteLength / BYTES_PER_SPLAT;
  const f = new Float32Array(buffer);
  const u8 = new Uint8Array(buffer);
  const u32 = new Uint32Array(buffer);
  const pos = new Float32Array(3 * n), cov = new Float32Array(6 * n), rgba = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    const fo = 8 * i, bo = 32 * i;
    pos[3 * i] = f[fo]; pos[3 * i + 1] = f[fo + 1]; pos[3 * i + 2] = f[fo + 2];
    const sx = f[fo + 3], sy = f[fo + 4], sz = f[fo + 5];
    rgba[i] = u32[fo + 6];
    let w = (u8[bo + 28] - 128) / 128, x = (u8[bo + 29] - 128) / 128;
    let y = (u8[bo + 30] - 128) / 128, z = (u8[bo + 31] - 128) / 128;
    const qn = Math.hypot(w, x, y, z) || 1;
    putCovariance(cov, 6 * i, w / qn, x / qn, y / qn, z / qn, sx, sy, sz);
  }
  return { n, pos, cov, rgba, antialiased: false };
}

// Unit quaternion (w, x, y, z) and linear scales -> the 6 covariance entries at cov[c..c+5].
function putCovariance(cov, c, w, x, y, z, sx, sy, sz) {
  const m = [
    (1 - 2 * (y * y + z * z)) * sx, 2 * (x * y - w * z) * sy, 2 * (x * z + w * y) * sz,
    2 * (x * y + w * z) * sx, (1 - 2 * (x * x + z * z)) * sy, 2 * (y * z - w * x) * sz,
    2 * (x * z - w * y) * sx, 2 * (y * z + w * x) * sy, (1 - 2 * (x * x + y * y)) * sz,
  ];
  const dot = (r, s) => m[3 * r] * m[3 * s] + m[3 * r + 1] * m[3 * s + 1] + m[3 * r + 2] * m[3 * s + 2];
  cov[c] = dot(0, 0); cov[c + 1] = dot(0, 1); cov[c + 2] = dot(0, 2);
  cov[c + 3] = dot(1, 1); cov[c + 4] = dot(1, 2); cov[c + 5] = dot(2, 2);
}

const SH_C0 = 0.28209479177387814;
const SPZ_MAGIC = 0x5053474e;

// An .spz file's header (16 bytes, as versions 2-3 hold it) and its sections back to back:
// versions 2-3 are one gzip stream of exactly that; version 4 has a 32-byte plain header, a table
// of contents (compressed, uncompressed size: u64 each) and one ZSTD frame per section.
async function spzPayload(buffer) {
  const head = new Uint8Array(buffer, 0, Math.min(32, buffer.byteLength));
  if (head[0] === 0x1f && head[1] === 0x8b) {
    const stream = new Blob([buffer]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).arrayBuffer();
  }
  const dv = new DataView(buffer);
  if (buffer.byteLength < 32 || dv.getUint32(0, true) !== SPZ_MAGIC) throw new Error("not an .spz file");
  const version = dv.getUint32(4, true);
  if (version < 4) throw new Error(`.spz version ${version} should be gzip'd`);
  const streams = dv.getUint8(15), toc = dv.getUint32(16, true);
  if (toc < 32 || toc + 16 * streams > buffer.byteLength) throw new Error(".spz table of contents out of bounds");
  const sizes = [];
  for (let i = 0; i < streams; i++) {
    sizes.push([Number(dv.getBigUint64(toc + 16 * i, true)), Number(dv.getBigUint64(toc + 16 * i + 8, true))]);
  }
  const out = new Uint8Array(16 + sizes.reduce((t, [, u]) => t + u, 0));
  out.set(head.subarray(0, 16));
  let src = toc + 16 * streams, dst = 16;
  for (const [packed, size] of sizes) {
    if (src + packed > buffer.byteLength) throw new Error(".spz file is truncated");
    const got = zstdDecompress(new Uint8Array(buffer, src, packed), out.subarray(dst, dst + size));
    if (got.length !== size) throw new Error(".spz stream is not the size its table says");
    src += packed; dst += size;
  }
  return out.buffer;
}

// .spz bytes (versions 2-4; worker/exports/spz.py describes the layout) -> what parseSplat
// returns plus `antialiased`. The file holds RUB axes converted from the job's world frame as
// from a PLY's (y and z negated); that is undone so the page's cameras fit.
export async function parseSpz(buffer) {
  const raw = await spzPayload(buffer);
  const dv = new DataView(raw);
  if (raw.byteLength < 16 || dv.getUint32(0, true) !== SPZ_MAGIC) throw new Error("not an .spz file");
  const version = dv.getUint32(4, true), n = dv.getUint32(8, true);
  const degree = dv.getUint8(12), bits = dv.getUint8(13), flags = dv.getUint8(14);
  if (version < 2 || version > 4) throw new Error(`.spz version ${version} is not supported`);
  const rotBytes = version >= 3 ? 4 : 3;
  const shDim = [0, 3, 8, 15][degree] || 0;
  if (raw.byteLength < 16 + n * (16 + rotBytes + 3 * shDim)) throw new Error(".spz file is truncated");
  const u8 = new Uint8Array(raw, 16);
  const posOfs = 0, alphaOfs = 9 * n, colorOfs = 10 * n, scaleOfs = 13 * n, rotOfs = 16 * n;
  const pos = new Float32Array(3 * n), cov = new Float32Array(6 * n), rgba = new Uint32Array(n);
  const unitLen = 1 / (1 << bits);
  const byte = (v) => Math.max(0, Math.min(255, Math.round(v * 255)));
  const colour = (b) => byte((SH_C0 * (b / 255 - 0.5)) / 0.15 + 0.5);
  const q = new Float64Array(4); // x, y, z, w in the file's axes
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < 3; j++) {
      const o = posOfs + 9 * i + 3 * j;
      let v = u8[o] | (u8[o + 1] << 8) | (u8[o + 2] << 16);
      if (v & 0x800000) v -= 0x1000000;
      pos[3 * i + j] = (j === 0 ? v : -v) * unitLen; // back from RUB: y and z negated
    }
    const c = colorOfs + 3 * i, s = scaleOfs + 3 * i;
    rgba[i] = (colour(u8[c]) | (colour(u8[c + 1]) << 8) | (colour(u8[c + 2]) << 16) | (u8[alphaOfs + i] << 24)) >>> 0;
    if (rotBytes === 4) {
      const o = rotOfs + 4 * i;
      let packed = (u8[o] | (u8[o + 1] << 8) | (u8[o + 2] << 16) | (u8[o + 3] << 24)) >>> 0;
      const largest = packed >>> 30;
      let sum = 0;
      for (let axis = 3; axis >= 0; axis--) {
        if (axis === largest) continue;
        const v = (Math.SQRT1_2 * (packed & 511)) / 511;
        q[axis] = (packed >>> 9) & 1 ? -v : v;
        sum += v * v;
        packed >>>= 10;
      }
      q[largest] = Math.sqrt(Math.max(0, 1 - sum));
    } else {
      const o = rotOfs + 3 * i;
      q[0] = u8[o] / 127.5 - 1; q[1] = u8[o + 1] / 127.5 - 1; q[2] = u8[o + 2] / 127.5 - 1;
      q[3] = Math.sqrt(Math.max(0, 1 - q[0] * q[0] - q[1] * q[1] - q[2] * q[2]));
    }
    const qn = Math.hypot(q[0], q[1], q[2], q[3]) || 1;
    // back from RUB: (w, x, y, z) -> (w, x, -y, -z)
    putCovariance(cov, 6 * i, q[3] / qn, q[0] / qn, -q[1] / qn, -q[2] / qn,
      Math.exp(u8[s] / 16 - 10), Math.exp(u8[s + 1] / 16 - 10), Math.exp(u8[s + 2] / 16 - 10));
  }
  return { n, pos, cov, rgba, antialiased: (flags & 1) === 1 };
}

const packByte = (v) => Math.max(0, Math.min(255, Math.round(v * 255)));
const packRgba = (r, g, b, a) => (packByte(r) | (packByte(g) << 8) | (packByte(b) << 16) | (packByte(a) << 24)) >>> 0;

// A binary little-endian PLY's header -> {elements: [{name, count, props: [[type, name]]}], body}.
function plyHeader(buffer) {
  const bytes = new Uint8Array(buffer);
  const limit = Math.min(bytes.length, 65536);
  let text = "";
  for (let i = 0; i < limit; i++) text += String.fromCharCode(bytes[i]);
  const end = text.indexOf("end_header\n");
  if (!text.startsWith("ply\n") || end < 0) throw new Error("not a PLY file");
  const elements = [];
  const lines = text.slice(0, end).split("\n");
  if (!lines.includes("format binary_little_endian 1.0")) throw new Error("not a binary little-endian PLY");
  for (const line of lines) {
    const w = line.trim().split(/\s+/);
    if (w[0] === "element") elements.push({ name: w[1], count: Number(w[2]), props: [] });
    else if (w[0] === "property") elements[elements.length - 1].props.push([w[1], w[2]]);
  }
  return { elements, body: end + "end_header\n".length, comments: lines.filter((l) => l.startsWith("comment ")) };
}

const PLY_SIZES = { char: 1, uchar: 1, short: 2, ushort: 2, int: 4, uint: 4, float: 4, double: 8 };

// SuperSplat's .compressed.ply (worker/exports/compressed_ply.py describes it): chunks of 256
// Gaussians quantised within their chunk's bounds. The job's world frame, as the 3DGS PLY.
export function parseCompressedPly(buffer) {
  const { elements, body, comments } = plyHeader(buffer);
  const dv = new DataView(buffer);
  let offset = body;
  const at = {};
  for (const e of elements) {
    const stride = e.props.reduce((t, [type]) => t + PLY_SIZES[type], 0);
    at[e.name] = { ...e, offset, stride };
    offset += stride * e.count;
  }
  const chunk = at.chunk, vertex = at.vertex;
  if (!chunk || !vertex) throw new Error("not a compressed PLY (no chunk or vertex element)");
  const cField = (name) => chunk.props.findIndex(([, p]) => p === name);
  const vField = (name) => vertex.props.findIndex(([, p]) => p === name);
  const cf = ["min_x", "min_y", "min_z", "max_x", "max_y", "max_z", "min_scale_x", "min_scale_y", "min_scale_z",
    "max_scale_x", "max_scale_y", "max_scale_z", "min_r", "min_g", "min_b", "max_r", "max_g", "max_b"].map(cField);
  const vf = ["packed_position", "packed_rotation", "packed_scale", "packed_color"].map(vField);
  if (vf.some((i) => i < 0) || cf.slice(0, 12).some((i) => i < 0)) throw new Error("compressed PLY without its packed fields");
  const n = vertex.count;
  const pos = new Float32Array(3 * n), cov = new Float32Array(6 * n), rgba = new Uint32Array(n);
  const lerp = (a, b, t) => a + (b - a) * t;
  const norm = Math.SQRT2 * 0.5;
  const q = [0, 0, 0, 0];
  for (let i = 0; i < n; i++) {
    const c = chunk.offset + chunk.stride * (i >> 8);
    const b = (k) => dv.getFloat32(c + 4 * cf[k], true);
    const v = (k) => dv.getUint32(vertex.offset + vertex.stride * i + 4 * vf[k], true);
    const pp = v(0), pr = v(1), ps = v(2), pc = v(3);
    pos[3 * i] = lerp(b(0), b(3), (pp >>> 21) / 2047);
    pos[3 * i + 1] = lerp(b(1), b(4), ((pp >>> 11) & 1023) / 1023);
    pos[3 * i + 2] = lerp(b(2), b(5), (pp & 2047) / 2047);
    const largest = pr >>> 30;
    let sum = 0, shift = 20;
    for (let k = 0; k < 4; k++) {
      if (k === largest) continue;
      q[k] = (((pr >>> shift) & 1023) / 1023 - 0.5) / norm;
      sum += q[k] * q[k];
      shift -= 10;
    }
    q[largest] = Math.sqrt(Math.max(0, 1 - sum));
    const qn = Math.hypot(q[0], q[1], q[2], q[3]) || 1;
    putCovariance(cov, 6 * i, q[0] / qn, q[1] / qn, q[2] / qn, q[3] / qn,
      Math.exp(lerp(b(6), b(9), (ps >>> 21) / 2047)), Math.exp(lerp(b(7), b(10), ((ps >>> 11) & 1023) / 1023)),
      Math.exp(lerp(b(8), b(11), (ps & 2047) / 2047)));
    const ch = (k, bitsShift) => ((pc >>> bitsShift) & 255) / 255;
    const colour = cf[12] < 0
      ? [ch(0, 24), ch(1, 16), ch(2, 8)] // the older layout: colours over 0..1
      : [lerp(b(12), b(15), ch(0, 24)), lerp(b(13), b(16), ch(1, 16)), lerp(b(14), b(17), ch(2, 8))];
    rgba[i] = packRgba(colour[0], colour[1], colour[2], (pc & 255) / 255);
  }
  const antialiased = comments.some((c) => c === "comment antialiased 1" || c === "comment SplatRenderMode: mip");
  return { n, pos, cov, rgba, antialiased };
}

// A .glb with a KHR_gaussian_splatting primitive (worker/exports/gltf_splat.py): float attributes,
// RUB axes (glTF's) turned back to the job's world frame (y and z negated, as for .spz).
export function parseGlb(buffer) {
  const dv = new DataView(buffer);
  if (buffer.byteLength < 20 || dv.getUint32(0, true) !== 0x46546c67) throw new Error("not a .glb file");
  const jsonLength = dv.getUint32(12, true);
  const gltf = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 20, jsonLength)));
  const binStart = 20 + jsonLength + 8;
  const prim = (gltf.meshes || []).flatMap((m) => m.primitives).find((p) => p.extensions && p.extensions.KHR_gaussian_splatting);
  if (!prim) throw new Error(".glb without a KHR_gaussian_splatting primitive");
  const EXT = "KHR_gaussian_splatting:";
  const attr = (name, width) => {
    const index = prim.attributes[name];
    if (index === undefined) throw new Error(`.glb without ${name}`);
    const acc = gltf.accessors[index], view = gltf.bufferViews[acc.bufferView];
    if (acc.componentType !== 5126) throw new Error(`${name}: only float attributes are read`);
    const stride = (view.byteStride || 4 * width) / 4;
    const base = binStart + (view.byteOffset || 0) + (acc.byteOffset || 0);
    const data = new Float32Array(buffer.slice(base, base + 4 * (stride * (acc.count - 1) + width)));
    return { n: acc.count, get: (i, k) => data[stride * i + k] };
  };
  const p = attr("POSITION", 3), r = attr(EXT + "ROTATION", 4), s = attr(EXT + "SCALE", 3);
  const o = attr(EXT + "OPACITY", 1), dc = attr(EXT + "SH_DEGREE_0_COEF_0", 3);
  const n = p.n;
  const pos = new Float32Array(3 * n), cov = new Float32Array(6 * n), rgba = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    pos[3 * i] = p.get(i, 0); pos[3 * i + 1] = -p.get(i, 1); pos[3 * i + 2] = -p.get(i, 2);
    const x = r.get(i, 0), y = r.get(i, 1), z = r.get(i, 2), w = r.get(i, 3);
    const qn = Math.hypot(w, x, y, z) || 1;
    putCovariance(cov, 6 * i, w / qn, x / qn, -y / qn, -z / qn, s.get(i, 0), s.get(i, 1), s.get(i, 2));
    rgba[i] = packRgba(SH_C0 * dc.get(i, 0) + 0.5, SH_C0 * dc.get(i, 1) + 0.5, SH_C0 * dc.get(i, 2) + 0.5, o.get(i, 0));
  }
  return { n, pos, cov, rgba, antialiased: Boolean(prim.extras && prim.extras.antialiased) };
}

// The entries of a zip of stored (uncompressed) members, as SOG bundles are: name -> bytes.
function storedZip(buffer) {
  const dv = new DataView(buffer);
  let eocd = -1;
  for (let i = buffer.byteLength - 22; i >= Math.max(0, buffer.byteLength - 65557); i--) {
    if (dv.getUint32(i, true) === 0x06054b50) { eocd = i; break; }
  }
  if (eocd < 0) throw new Error("not a zip file");
  const entries = dv.getUint16(eocd + 10, true);
  let at = dv.getUint32(eocd + 16, true);
  const out = {};
  for (let k = 0; k < entries; k++) {
    if (dv.getUint32(at, true) !== 0x02014b50) throw new Error("zip directory is damaged");
    const method = dv.getUint16(at + 10, true), size = dv.getUint32(at + 20, true);
    const nameLen = dv.getUint16(at + 28, true), extraLen = dv.getUint16(at + 30, true);
    const commentLen = dv.getUint16(at + 32, true), local = dv.getUint32(at + 42, true);
    const name = new TextDecoder().decode(new Uint8Array(buffer, at + 46, nameLen));
    if (method !== 0) throw new Error(`zip member ${name} is compressed (SOG bundles store them)`);
    const data = local + 30 + dv.getUint16(local + 26, true) + dv.getUint16(local + 28, true);
    out[name] = new Uint8Array(buffer, data, size);
    at += 46 + nameLen + extraLen + commentLen;
  }
  return out;
}

// WebP bytes -> {width, height, rgba} with every byte as stored: the browser decodes the image
// without premultiplying or colour-converting it, and WebGL reads the texels back (a 2D canvas
// would premultiply, losing the colour of texels whose alpha, an opacity, is low).
async function webpTexels(bytes) {
  const bitmap = await createImageBitmap(new Blob([bytes], { type: "image/webp" }),
    { premultiplyAlpha: "none", colorSpaceConversion: "none" });
  const { width, height } = bitmap;
  const gl = new OffscreenCanvas(1, 1).getContext("webgl2");
  if (!gl) throw new Error("WebGL2 is unavailable");
  gl.pixelStorei(gl.UNPACK_PREMULTIPLY_ALPHA_WEBGL, false);
  gl.pixelStorei(gl.UNPACK_COLORSPACE_CONVERSION_WEBGL, gl.NONE);
  const tex = gl.createTexture();
  gl.bindTexture(gl.TEXTURE_2D, tex);
  gl.texImage2D(gl.TEXTURE_2D, 0, gl.RGBA8, width, height, 0, gl.RGBA, gl.UNSIGNED_BYTE, bitmap);
  const fb = gl.createFramebuffer();
  gl.bindFramebuffer(gl.FRAMEBUFFER, fb);
  gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0, gl.TEXTURE_2D, tex, 0);
  const rgba = new Uint8Array(4 * width * height);
  gl.readPixels(0, 0, width, height, gl.RGBA, gl.UNSIGNED_BYTE, rgba);
  bitmap.close();
  gl.deleteFramebuffer(fb);
  gl.deleteTexture(tex);
  const lose = gl.getExtension("WEBGL_lose_context");
  if (lose) lose.loseContext();
  return { width, height, rgba };
}

// PlayCanvas' SOG bundle (.sog, version 2; worker/exports/sog.py describes it): the job's world
// frame, as the 3DGS PLY. Only the SH DC band is drawn, as for the other files.
export async function parseSog(buffer) {
  const files = storedZip(buffer);
  if (!files["meta.json"]) throw new Error("not a SOG bundle (no meta.json)");
  const meta = JSON.parse(new TextDecoder().decode(files["meta.json"]));
  if (meta.version !== 2) throw new Error(`SOG version ${meta.version} is not supported`);
  const tex = async (name) => {
    if (!files[name]) throw new Error(`SOG bundle without ${name}`);
    return (await webpTexels(files[name])).rgba;
  };
  const [lo, hi, qt, sc, c0] = await Promise.all([meta.means.files[0], meta.means.files[1],
    meta.quats.files[0], meta.scales.files[0], meta.sh0.files[0]].map(tex));
  const n = meta.count;
  const { mins, maxs } = meta.means;
  const sBook = meta.scales.codebook, cBook = meta.sh0.codebook;
  const unlog = (v) => Math.sign(v) * (Math.exp(Math.abs(v)) - 1);
  const pos = new Float32Array(3 * n), cov = new Float32Array(6 * n), rgba = new Uint32Array(n);
  const q = [0, 0, 0, 0];
  for (let i = 0; i < n; i++) {
    const t = 4 * i;
    for (let k = 0; k < 3; k++) {
      const u = (lo[t + k] | (hi[t + k] << 8)) / 65535;
      pos[3 * i + k] = unlog(mins[k] + (maxs[k] - mins[k]) * u);
    }
    const largest = qt[t + 3] - 252;
    let sum = 0, j = 0;
    for (let k = 0; k < 4; k++) {
      if (k === largest) continue;
      q[k] = ((qt[t + j] / 255) * 2 - 1) / Math.SQRT2;
      sum += q[k] * q[k];
      j++;
    }
    q[largest] = Math.sqrt(Math.max(0, 1 - sum));
    const qn = Math.hypot(q[0], q[1], q[2], q[3]) || 1;
    putCovariance(cov, 6 * i, q[0] / qn, q[1] / qn, q[2] / qn, q[3] / qn,
      Math.exp(sBook[sc[t]]), Math.exp(sBook[sc[t + 1]]), Math.exp(sBook[sc[t + 2]]));
    rgba[i] = packRgba(SH_C0 * cBook[c0[t]] + 0.5, SH_C0 * cBook[c0[t + 1]] + 0.5, SH_C0 * cBook[c0[t + 2]] + 0.5,
      c0[t + 3] / 255);
  }
  return { n, pos, cov, rgba, antialiased: meta.model === "antialiased" };
}

// The parser of each splat export the viewer can draw (api_schemas/exports.py's formats).
export const PARSERS = {
  spz: parseSpz,
  sog: parseSog,
  compressed_ply: parseCompressedPly,
  glb: parseGlb,
  splat: parseSplat,
};

// ---- cameras -------------------------------------------------------------------------

const sub = (a, b) => a.map((v, i) => v - b[i]);
const cross = (a, b) => [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]];
const unit = (a) => { const l = Math.hypot(...a); return a.map((v) => v / l); };

// c2w (rows, OpenGL axes) of a camera at eye looking at target, as worker/cameras.py look_at.
export function lookAt(eye, target, up) {
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

// World -> OpenCV camera (x right, y down, z forward) as a column-major mat4.
function viewMatrix(c2w) {
  const r = [0, 1, 2].map((i) => [0, 1, 2].map((j) => c2w[j][i] * (i === 0 ? 1 : -1))); // diag(1,-1,-1) R^T
  const t = [0, 1, 2].map((i) => -(r[i][0] * c2w[0][3] + r[i][1] * c2w[1][3] + r[i][2] * c2w[2][3]));
  return new Float32Array([
    r[0][0], r[1][0], r[2][0], 0,
    r[0][1], r[1][1], r[2][1], 0,
    r[0][2], r[1][2], r[2][2], 0,
    t[0], t[1], t[2], 1,
  ]);
}

// ---- WebGL2 --------------------------------------------------------------------------

// `row`: splats per texture row (3 texels each), as many as the device's texture width allows
const vertexShader = (row) => `#version 300 es
precision highp float;
precision highp int;
uniform highp usampler2D u_data;
uniform mat4 u_view;
uniform vec4 u_intr;   // fx, fy, cx, cy
uniform vec2 u_size;   // width, height (pixels)
uniform bool u_aa;     // the file was trained with the antialiasing filter
in uint a_index;
const vec2 CORNERS[6] = vec2[6](vec2(-1.0, -1.0), vec2(1.0, -1.0), vec2(-1.0, 1.0),
                                vec2(-1.0, 1.0), vec2(1.0, -1.0), vec2(1.0, 1.0));
out vec4 v_color;
out vec3 v_conic;
out vec2 v_d;
void main() {
  gl_Position = vec4(2.0, 2.0, 2.0, 1.0);  // culled unless set below
  int i = int(a_index);
  ivec2 base = ivec2((i % ${row}) * 3, i / ${row});
  uvec4 t0 = texelFetch(u_data, base, 0);
  uvec4 t1 = texelFetch(u_data, base + ivec2(1, 0), 0);
  uvec4 t2 = texelFetch(u_data, base + ivec2(2, 0), 0);
  vec3 p = (u_view * vec4(uintBitsToFloat(t0.xyz), 1.0)).xyz;
  if (p.z <= 0.05) return;  // the server's near plane
  vec4 rgba = vec4(t0.w & 255u, (t0.w >> 8) & 255u, (t0.w >> 16) & 255u, t0.w >> 24) / 255.0;
  vec4 c1 = uintBitsToFloat(t1);
  vec2 c2 = uintBitsToFloat(t2.xy);
  mat3 sigma = mat3(c1.x, c1.y, c1.z, c1.y, c1.w, c2.x, c1.z, c2.x, c2.y);
  float fx = u_intr.x, fy = u_intr.y;
  vec2 lim = 1.3 * 0.5 * u_size / vec2(fx, fy);
  float tx = clamp(p.x / p.z, -lim.x, lim.x) * p.z;
  float ty = clamp(p.y / p.z, -lim.y, lim.y) * p.z;
  mat3 jac = mat3(fx / p.z, 0.0, 0.0, 0.0, fy / p.z, 0.0,
                  -fx * tx / (p.z * p.z), -fy * ty / (p.z * p.z), 0.0);
  mat3 t = jac * mat3(u_view);
  mat3 cov = t * sigma * transpose(t);
  float a = cov[0][0] + 0.3, b = cov[0][1], c = cov[1][1] + 0.3;
  float det = a * c - b * b;
  if (det <= 0.0) return;
  if (u_aa) rgba.a *= sqrt(max(cov[0][0] * cov[1][1] - b * b, 0.0) / det);  // mip-splatting's filter
  float q = 2.0 * log(rgba.a * 255.0);  // alpha >= 1/255 only inside d^T conic d <= q
  if (q <= 0.0) return;
  vec2 mean = vec2(fx * p.x / p.z + u_intr.z, fy * p.y / p.z + u_intr.w);
  v_d = CORNERS[gl_VertexID % 6] * sqrt(q * vec2(a, c));
  vec2 pix = mean + v_d;
  gl_Position = vec4(2.0 * pix.x / u_size.x - 1.0, 1.0 - 2.0 * pix.y / u_size.y, 0.0, 1.0);
  v_conic = vec3(c / det, -b / det, a / det);
  v_color = rgba;
}`;

const FRAGMENT = `#version 300 es
precision highp float;
in vec4 v_color;
in vec3 v_conic;
in vec2 v_d;
out vec4 o;
void main() {
  float power = -0.5 * (v_conic.x * v_d.x * v_d.x + v_conic.z * v_d.y * v_d.y) - v_conic.y * v_d.x * v_d.y;
  if (power > 0.0) discard;
  float alpha = min(0.99, v_color.a * exp(power));
  if (alpha < 1.0 / 255.0) discard;
  o = vec4(v_color.rgb * alpha, alpha);
}`;

function compile(gl, type, src) {
  const s = gl.createShader(type);
  gl.shaderSource(s, src);
  gl.compileShader(s);
  if (!gl.getShaderParameter(s, gl.COMPILE_STATUS)) throw new Error(gl.getShaderInfoLog(s));
  return s;
}

export class SplatRenderer {
  constructor(canvas) {
    // preserveDrawingBuffer: the frame stays readable (screenshots, toDataURL) after compositing
    const gl = canvas.getContext("webgl2", { antialias: false, alpha: false, preserveDrawingBuffer: true });
    if (!gl) throw new Error("this browser has no WebGL2");
    this.gl = gl;
    this.canvas = canvas;
    this.maxTexture = gl.getParameter(gl.MAX_TEXTURE_SIZE);
    this.row = Math.floor(this.maxTexture / 3);
    const prog = gl.createProgram();
    gl.attachShader(prog, compile(gl, gl.VERTEX_SHADER, vertexShader(this.row)));
    gl.attachShader(prog, compile(gl, gl.FRAGMENT_SHADER, FRAGMENT));
    gl.linkProgram(prog);
    if (!gl.getProgramParameter(prog, gl.LINK_STATUS)) throw new Error(gl.getProgramInfoLog(prog));
    this.prog = prog;
    this.loc = Object.fromEntries(["u_data", "u_view", "u_intr", "u_size", "u_aa"].map((k) => [k, gl.getUniformLocation(prog, k)]));
    this.vao = gl.createVertexArray();
    gl.bindVertexArray(this.vao);
    this.indexBuf = gl.createBuffer();
    gl.bindBuffer(gl.ARRAY_BUFFER, this.indexBuf);
    const aIndex = gl.getAttribLocation(prog, "a_index");
    gl.enableVertexAttribArray(aIndex);
    gl.vertexAttribIPointer(aIndex, 1, gl.UNSIGNED_INT, 0, 0);
    this.tex = gl.createTexture();
    this.n = 0;
    this.frames = 0;
  }

  setData({ n, pos, cov, rgba, antialiased = false }) {
    this.antialiased = antialiased;
    const gl = this.gl;
    const row = this.row;
    const rows = Math.max(1, Math.ceil(n / row));
    if (rows > this.maxTexture) throw new Error(`${n} Gaussians do not fit this device's textures`);
    const texels = new Uint32Array(row * 3 * rows * 4);
    const fbits = new Uint32Array(pos.buffer), cbits = new Uint32Array(cov.buffer);
    for (let i = 0; i < n; i++) {
      const o = 12 * i; // 3 texels x 4 channels; texel order matches the shader's base + k
      texels[o] = fbits[3 * i]; texels[o + 1] = fbits[3 * i + 1]; texels[o + 2] = fbits[3 * i + 2];
      texels[o + 3] = rgba[i];
      for (let k = 0; k < 6; k++) texels[o + 4 + k] = cbits[6 * i + k];
    }
    gl.bindTexture(gl.TEXTURE_2D, this.tex);
    gl.texImage2D(gl.TEXTURE_2D, 0, gl.RGBA32UI, row * 3, rows, 0, gl.RGBA_INTEGER, gl.UNSIGNED_INT, texels);
    gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MIN_FILTER, gl.NEAREST);
    gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MAG_FILTER, gl.NEAREST);
    this.n = n;
    this.pos = pos;
    this.order = new Uint32Array(n);
    this.six = new Uint32Array(6 * n);
    this.depthKeys = new Float32Array(n);
    this.counts = new Uint32Array(65537);
  }

  // Far to near by depth along the view axis: a counting sort on 16-bit keys (O(n) per frame,
  // as antimatter15/splat's worker does). Each splat is drawn as two triangles of its own
  // (six vertices carrying its index) rather than instanced: software WebGL (SwiftShader, what
  // headless and GPU-less browsers use) pays per instance far more than per vertex.
  sort(view) {
    const { n, pos, depthKeys: z, counts, order } = this;
    let lo = Infinity, hi = -Infinity;
    for (let i = 0; i < n; i++) {
      const d = view[2] * pos[3 * i] + view[6] * pos[3 * i + 1] + view[10] * pos[3 * i + 2] + view[14];
      z[i] = d;
      if (d < lo) lo = d;
      if (d > hi) hi = d;
    }
    const scale = hi > lo ? 65535 / (hi - lo) : 0;
    counts.fill(0);
    const keys = new Uint16Array(n);
    for (let i = 0; i < n; i++) {
      keys[i] = 65535 - Math.floor((z[i] - lo) * scale); // far first
      counts[keys[i] + 1]++;
    }
    for (let k = 1; k <= 65536; k++) counts[k] += counts[k - 1];
    for (let i = 0; i < n; i++) order[counts[keys[i]]++] = i;
    const six = this.six;
    for (let k = 0, o = 0; k < n; k++, o += 6) {
      const v = order[k];
      six[o] = v; six[o + 1] = v; six[o + 2] = v; six[o + 3] = v; six[o + 4] = v; six[o + 5] = v;
    }
    const gl = this.gl;
    gl.bindBuffer(gl.ARRAY_BUFFER, this.indexBuf);
    gl.bufferData(gl.ARRAY_BUFFER, six, gl.DYNAMIC_DRAW);
  }

  // cam: {c2w (4x4 rows, world frame, OpenGL axes), fx, fy, cx, cy, width, height, background}
  draw(cam) {
    const gl = this.gl;
    if (this.canvas.width !== cam.width) this.canvas.width = cam.width;
    if (this.canvas.height !== cam.height) this.canvas.height = cam.height;
    const view = viewMatrix(cam.c2w);
    gl.viewport(0, 0, cam.width, cam.height);
    const [r, g, b] = cam.background;
    gl.clearColor(r, g, b, 1);
    gl.clear(gl.COLOR_BUFFER_BIT);
    if (!this.n) return;
    const t0 = performance.now();
    this.sort(view);
    this.sortMs = performance.now() - t0;
    gl.useProgram(this.prog);
    gl.bindVertexArray(this.vao);
    gl.activeTexture(gl.TEXTURE0);
    gl.bindTexture(gl.TEXTURE_2D, this.tex);
    gl.uniform1i(this.loc.u_data, 0);
    gl.uniformMatrix4fv(this.loc.u_view, false, view);
    gl.uniform4f(this.loc.u_intr, cam.fx, cam.fy, cam.cx, cam.cy);
    gl.uniform2f(this.loc.u_size, cam.width, cam.height);
    gl.uniform1i(this.loc.u_aa, this.antialiased ? 1 : 0);
    gl.disable(gl.DEPTH_TEST);
    gl.enable(gl.BLEND);
    gl.blendFunc(gl.ONE, gl.ONE_MINUS_SRC_ALPHA); // premultiplied, back to front
    gl.drawArrays(gl.TRIANGLES, 0, 6 * this.n);
    this.frames += 1;
  }

  dispose() {
    const gl = this.gl;
    gl.deleteTexture(this.tex);
    gl.deleteBuffer(this.indexBuf);
    gl.deleteProgram(this.prog);
  }
}

// ---- the page's viewer for splat jobs -------------------------------------------------

const BACKGROUNDS = { white: [1, 1, 1], black: [0, 0, 0] };

function background(job) {
  const b = (job.config || {}).background;
  if (Array.isArray(b) && b.length === 3) return b.map(Number);
  return BACKGROUNDS[b] || BACKGROUNDS.white;
}

// The files the viewer draws, in its "file" menu: the .spz first (the smallest with every
// Gaussian's antialiasing flag, what it loads unless told otherwise).
export const VIEWER_FILES = [
  ["spz", ".spz (Niantic, version 4)"],
  ["sog", ".sog (PlayCanvas)"],
  ["compressed_ply", ".compressed.ply (SuperSplat)"],
  ["glb", ".glb (KHR_gaussian_splatting)"],
];

// One of the job's splat exports: made on a worker on first use (POST answers the existing one
// after).
async function splatExport(jobId, format, onState) {
  let state = await api.createExport(jobId, { format });
  while (state.status === "queued" || state.status === "running") {
    onState(state);
    await new Promise((r) => setTimeout(r, 300));
    state = await api.getExport(jobId, state.id);
  }
  if (state.status !== "succeeded") throw new Error(state.error || `export ${state.status}`);
  return state;
}

export class SplatViewer {
  constructor(root, job) {
    this.job = job;
    this.o = initialOrbit(job);
    const [w, h] = datasetSize(job);
    [this.width, this.height] = fitSize([w, h], Math.min(MAX_SIDE, Math.max(w, h)));
    this.background = background(job);
    this.disposed = false;
    this.pending = false;
    this.canvas = el("canvas", { id: "splat-canvas", width: String(this.width), height: String(this.height) });
    this.canvas.style.width = `${Math.max(this.width, 400)}px`;
    this.canvas.nfViewer = this; // scripts and tests reach the viewer through its canvas
    this.hud = el("span", { class: "hud", id: "splat-hud" }, "");
    this.msg = el("span", { class: "muted", id: "splat-msg" }, "preparing the .spz file…");
    this.download = el("a", { class: "button secondary", id: "splat-download", hidden: "" }, "Download .spz");
    this.fileSelect = el("select", { id: "splat-format", title: "the export the viewer draws" },
      VIEWER_FILES.map(([v, label]) => el("option", { value: v }, label)));
    this.fileSelect.addEventListener("change", () => { this.ready = this.load(this.fileSelect.value); });
    this.stage = el("div", { class: "stage orbit", title: "drag or arrow keys to orbit, scroll or +/- to zoom" }, this.canvas, this.hud);
    root.replaceChildren(
      el("h3", {}, "Viewer (Gaussians drawn in this browser)"),
      this.stage,
      el("div", { class: "controls" }, this.fileSelect, this.msg, this.download),
      el("div", { id: "path-editor", class: "path-editor" }),
    );
    this.paths = new PathEditor(root.querySelector("#path-editor"), job, this);
    this.fpsWindow = [];
    this.ready = this.load("spz");
  }

  // Draw the job's export in `format` (VIEWER_FILES): made on a worker if it is not yet, then
  // downloaded and parsed here.
  async load(format) {
    const parse = PARSERS[format];
    this.format = format;
    this.fileSelect.value = format;
    delete this.canvas.dataset.ready;
    this.msg.className = "muted";
    this.msg.textContent = `preparing the ${format} file…`;
    try {
      const state = await splatExport(this.job.id, format, (s) => { this.msg.textContent = `export ${s.status}…`; });
      const blob = await api.download(state.url);
      if (this.disposed || this.format !== format) return;
      const data = await parse(await blob.arrayBuffer());
      if (this.disposed || this.format !== format) return;
      this.renderer = this.renderer || new SplatRenderer(this.canvas);
      this.renderer.setData(data);
      this.download.href = state.url;
      this.download.textContent = `Download ${state.artifact.slice(state.artifact.indexOf("."))}`;
      this.download.onclick = async (ev) => {
        ev.preventDefault();
        const a = el("a", { href: URL.createObjectURL(blob), download: state.artifact });
        a.click();
      };
      this.download.hidden = false;
      this.msg.textContent = `${this.renderer.n} Gaussians · drag to orbit, scroll to zoom`;
      if (!this.bound) this.bindPointer();
      this.bound = true;
      this.drawNow();
      this.canvas.dataset.ready = "1";
      this.canvas.dataset.format = format;
    } catch (err) {
      this.msg.textContent = `splat viewer unavailable: ${err.message}`;
      this.msg.className = "error";
    }
  }

  camera(c2w, fovXDeg, width = this.width, height = this.height) {
    const fx = (0.5 * width) / Math.tan((fovXDeg * Math.PI) / 360);
    return { c2w, fx, fy: fx, cx: width / 2, cy: height / 2, width, height, background: this.background };
  }

  orbitC2w() {
    const up = UPS[this.o.upKey];
    const seed = Math.abs(up[0]) < 0.9 ? [1, 0, 0] : [0, 1, 0];
    const d = seed[0] * up[0] + seed[1] * up[1] + seed[2] * up[2];
    const a = unit(seed.map((v, i) => v - d * up[i]));
    const b = cross(up, a);
    const { azimuth: az, elevation: e, radius: r } = this.o;
    const dir = [0, 1, 2].map((i) => (a[i] * Math.cos(az) + b[i] * Math.sin(az)) * Math.cos(e) + up[i] * Math.sin(e));
    const eye = dir.map((v, i) => this.o.target[i] + r * v);
    return lookAt(eye, this.o.target, up);
  }

  drawNow(cam) {
    if (!this.renderer || this.disposed) return;
    const t0 = performance.now();
    this.renderer.draw(cam || this.camera(this.orbitC2w(), this.o.fov));
    const ms = performance.now() - t0;
    this.fpsWindow = [...this.fpsWindow.slice(-29), ms];
    const mean = this.fpsWindow.reduce((s, v) => s + v, 0) / this.fpsWindow.length;
    this.hud.textContent = `${this.width}×${this.height} · ${mean.toFixed(1)} ms per frame (client)`;
  }

  // Draws at most once per animation frame however many pointer events arrive.
  changed() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.drawNow(); });
  }

  // For scripts and tests: draw one view given as a world-frame c2w (OpenGL axes, as render
  // requests take it) and a horizontal fov, optionally at another size.
  showPose(c2w, fovXDeg, width, height) {
    this.drawNow(this.camera(c2w, fovXDeg, width, height));
  }

  // ---- for the camera path editor (path_editor.js): previews are drawn here, every frame ----

  get drawsLocally() { return true; }

  pathView() { return { c2w: this.orbitC2w(), fovX: this.o.fov }; }

  pathSize() { return [this.width, this.height]; }

  previewPose(c2w, fovX) {
    this.showPose(c2w, fovX);
    return new Promise((resolve) => requestAnimationFrame(resolve));
  }

  endPreview() { this.drawNow(); }

  bindPointer() {
    let last = null;
    const s = this.stage;
    s.addEventListener("pointerdown", (ev) => { last = [ev.clientX, ev.clientY]; s.setPointerCapture(ev.pointerId); });
    s.addEventListener("pointermove", (ev) => {
      if (!last) return;
      this.o.azimuth -= (ev.clientX - last[0]) * 0.01;
      this.o.elevation = Math.max(-1.5, Math.min(1.5, this.o.elevation + (ev.clientY - last[1]) * 0.01));
      last = [ev.clientX, ev.clientY];
      this.changed();
    });
    const end = () => { last = null; };
    s.addEventListener("pointerup", end);
    s.addEventListener("pointercancel", end);
    s.tabIndex = 0;
    s.addEventListener("keydown", (ev) => {
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
      this.changed();
    });
    s.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      this.o.radius = Math.max(1e-3, this.o.radius * Math.exp(ev.deltaY * 0.001));
      this.changed();
    }, { passive: false });
  }

  dispose() {
    this.disposed = true;
    this.paths?.dispose();
    this.renderer?.dispose();
  }
}
