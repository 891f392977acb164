// A SnoozeML client in TypeScript for an image classifier (docs/images.md), with Node's
// `fetch`: each image file is sent as it is, raw bytes over the binary tensor data extension
// (one BYTES element: its length as 4 little-endian bytes, then the bytes), and the answer asks
// for the classification extension's three best classes ("score:index:label").
//
// Environment: SNOOZE_URL (default http://127.0.0.1:8080), SNOOZE_MODEL (default
// "classifier"), SNOOZE_OUTPUT (the scores output, default "logits") and, when the daemon has
// an [auth] table, SNOOZE_API_KEY (sent as the X-API-Key header).
//
//   npx tsx src/image.ts cat.jpg dog.png

import { readFile } from "node:fs/promises";
import { basename } from "node:path";

interface ClassifiedOutput {
  name: string;
  datatype: string; // BYTES: "score:index:label" strings
  shape: number[];
  data: string[];
}

const baseUrl = process.env.SNOOZE_URL ?? "http://127.0.0.1:8080";
const model = process.env.SNOOZE_MODEL ?? "classifier";
const output = process.env.SNOOZE_OUTPUT ?? "logits";
const apiKey = process.env.SNOOZE_API_KEY;

/** The binary extension's body: the JSON header, then each image's length and bytes. */
function binaryBody(images: Buffer[]): { body: Buffer; headerLength: number } {
  const elements = images.flatMap((image) => {
    const length = Buffer.alloc(4);
    length.writeUInt32LE(image.length);
    return [length, image];
  });
  const size = elements.reduce((total, part) => total + part.length, 0);
  const header = Buffer.from(JSON.stringify({
    inputs: [{ name: "image", shape: [images.length], datatype: "BYTES",
               parameters: { binary_data_size: size } }],
    outputs: [{ name: output, parameters: { classification: 3 } }],
  }));
  return { body: Buffer.concat([header, ...elements]), headerLength: header.length };
}

async function main(paths: string[]): Promise<void> {
  if (paths.length === 0) {
    throw new Error("usage: image.ts IMAGE...");
  }
  const images = await Promise.all(paths.map((path) => readFile(path)));
  const { body, headerLength } = binaryBody(images);
  const headers: Record<string, string> = {
    "Content-Type": "application/octet-stream",
    "Inference-Header-Content-Length": String(headerLength),
  };
  if (apiKey) {
    headers["X-API-Key"] = apiKey;
  }
  const response = await fetch(`${baseUrl}/v2/models/${model}/infer`, {
    method: "POST", headers, body,
  });
  if (!response.ok) {
    throw new Error(`HTTP ${response.status}: ${await response.text()}`);
  }
  // No binary output was asked for, so the answer is plain JSON.
  const answer = (await response.json()) as { outputs: ClassifiedOutput[] };
  const classified = answer.outputs.find((tensor) => tensor.name === output);
  if (classified === undefined) {
    throw new Error(`the answer has no ${output}`);
  }
  const perImage = classified.data.length / paths.length;
  paths.forEach((path, row) => {
    const best = classified.data.slice(row * perImage, (row + 1) * perImage);
    console.log(`${basename(path)}: ${best.join(" ")}`);
  });
}

main(process.argv.slice(2)).catch((error: unknown) => {
  console.error(error instanceof Error ? error.message : error);
  process.exit(1);
});
