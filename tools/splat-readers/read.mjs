// Reads a splat file with a reader we did not write and prints what it found as JSON, for the
// tests of the splat exports (tests/support/splat_readers.py runs it):
//
//   node read.mjs splat-transform FILE   PlayCanvas' splat-transform: .ply, .compressed.ply, .sog,
//                                        .spz -> {n, shBands, model, columns: {x: [...], ...}}
//                                        (raw columns as the reader decodes them: the file's axes,
//                                        log scales, opacity logits, rot_0..3 = w, x, y, z)
//   node read.mjs spz FILE               Niantic's own spz library (WebAssembly build, as
//                                        splat-transform writes .spz with it), no axis change
//   node read.mjs gltf FILE              glTF-Transform reads the .glb (KHR_gaussian_splatting
//                                        registered so its properties are read, not dropped) and
//                                        Khronos' glTF-Validator checks it
import { readFileSync } from "node:fs";
import { basename } from "node:path";

const [reader, file] = process.argv.slice(2);
const bytes = new Uint8Array(readFileSync(file));
// JSON has no infinities (an opacity byte of 255 decodes to a logit of +Infinity): +-1e30 stand
// in for them, null for NaN
const list = (a) => Array.from(a, (v) => (Number.isFinite(v) ? v : Number.isNaN(v) ? null : Math.sign(v) * 1e30));

async function splatTransform() {
  const st = await import("@playcanvas/splat-transform");
  const name = basename(file);
  const fs = new st.MemoryReadFileSystem();
  fs.set(name, bytes);
  const [source] = await st.readFile({ filename: name, inputFormat: st.getInputFormat(name), fileSystem: fs });
  const table = await st.materializeToDataTable(source, st.createChunkDataPool());
  const columns = {};
  for (const c of table.columns) columns[c.name] = list(c.data);
  return { n: table.numRows, shBands: source.meta.shBands, model: source.meta.model, columns };
}

async function spz() {
  const { default: createSpzModule } = await import("@adobe/spz");
  // the library logs to stdout: send it to stderr, stdout is the JSON
  const m = await createSpzModule({ print: (t) => console.error(t), printErr: (t) => console.error(t) });
  const c = m.loadSpzFromBuffer(bytes, { to: m.CoordinateSystem.UNSPECIFIED });
  return {
    n: c.numPoints, shDegree: c.shDegree, antialiased: c.antialiased,
    positions: list(c.positions), scales: list(c.scales), rotations: list(c.rotations),
    alphas: list(c.alphas), colors: list(c.colors), sh: list(c.sh),
  };
}

async function gltf() {
  const core = await import("@gltf-transform/core");
  const { Extension, ExtensionProperty, NodeIO, PropertyType } = core;
  const NAME = "KHR_gaussian_splatting";
  class Splatting extends ExtensionProperty {
    init() { this.extensionName = NAME; this.propertyType = "GaussianSplatting"; this.parentTypes = [PropertyType.PRIMITIVE]; }
    getDefaults() { return Object.assign(super.getDefaults(), { settings: {} }); }
  }
  class SplattingExtension extends Extension {
    extensionName = NAME;
    static EXTENSION_NAME = NAME;
    read(context) {
      (context.jsonDoc.json.meshes || []).forEach((meshDef, i) => {
        (meshDef.primitives || []).forEach((primDef, j) => {
          const def = primDef.extensions && primDef.extensions[NAME];
          if (!def) return;
          const prop = new Splatting(this.document.getGraph());
          prop.set("settings", def);
          context.meshes[i].listPrimitives()[j].setExtension(NAME, prop);
        });
      });
      return this;
    }
    write(context) { return this; }
  }
  const io = new NodeIO().registerExtensions([SplattingExtension]);
  const doc = await io.readBinary(bytes);
  const root = doc.getRoot();
  const prims = root.listMeshes().flatMap((m) => m.listPrimitives());
  const prim = prims[0];
  const attributes = {};
  for (const semantic of prim.listSemantics()) {
    const acc = prim.getAttribute(semantic);
    attributes[semantic] = { type: acc.getType(), count: acc.getCount(), normalized: acc.getNormalized(),
      componentType: acc.getComponentType(), values: list(acc.getArray()) };
  }
  const ext = prim.getExtension(NAME);
  const validator = await import("gltf-validator");
  const report = await validator.validateBytes(bytes, { maxIssues: 100 });
  return {
    extensionsUsed: root.listExtensionsUsed().map((e) => e.extensionName),
    primitives: prims.length, mode: prim.getMode(), extension: ext ? ext.get("settings") : null,
    extras: prim.getExtras(), attributes,
    validation: { errors: report.issues.numErrors, warnings: report.issues.numWarnings,
      messages: report.issues.messages.map((m) => `${m.code}: ${m.message} ${m.pointer || ""}`) },
  };
}

const readers = { "splat-transform": splatTransform, spz, gltf };
if (!readers[reader]) {
  console.error(`unknown reader ${reader}: one of ${Object.keys(readers).join(", ")}`);
  process.exit(2);
}
process.stdout.write(JSON.stringify(await readers[reader]()));
