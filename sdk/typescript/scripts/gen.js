// Build step: copies the API's proto into the package (it is loaded at run time) and generates
// its TypeScript types into src/generated/ (never committed).
const fs = require("node:fs");
const path = require("node:path");
const { execFileSync } = require("node:child_process");

const root = path.resolve(__dirname, "..");
const source = path.resolve(root, "../../proto/kairos/v1/api.proto");
const target = path.join(root, "proto/kairos/v1/api.proto");
if (fs.existsSync(source)) {
  fs.mkdirSync(path.dirname(target), { recursive: true });
  fs.copyFileSync(source, target);
} else if (!fs.existsSync(target)) {
  throw new Error(`proto: neither ${source} nor ${target} exists`);
}
const out = path.join(root, "src/generated");
fs.rmSync(out, { recursive: true, force: true });
const bin = require.resolve("@grpc/proto-loader/build/bin/proto-loader-gen-types.js");
execFileSync(process.execPath, [bin, "--longs=String", "--enums=String", "--defaults", "--oneofs",
  "--grpcLib=@grpc/grpc-js", "--outDir", out, `--includeDirs=${path.join(root, "proto")}`, "--", "kairos/v1/api.proto"],
  { stdio: "inherit" });
