// A SnoozeML client in TypeScript over HTTP: server readiness, model metadata and inference
// on the demo models (the Open Inference Protocol v2 with JSON tensors), with Node's `fetch`.
//
// Environment: SNOOZE_URL (default http://127.0.0.1:8080) and, when the daemon has an [auth]
// table, SNOOZE_API_KEY (sent as the X-API-Key header).
//
//   npx tsx src/http.ts

// The Open Inference Protocol's JSON, as far as this client reads and writes it.
interface TensorMetadata {
  name: string;
  datatype: string;
  shape: number[]; // -1 is a dynamic dimension
}

interface ModelMetadata {
  name: string;
  versions?: string[];
  platform: string;
  inputs: TensorMetadata[];
  outputs: TensorMetadata[];
}

interface InferTensor {
  name: string;
  datatype: string;
  shape: number[];
  data: number[]; // row-major, flat
}

interface InferRequest {
  id?: string;
  inputs: InferTensor[];
  outputs?: { name: string }[];
}

interface InferResponse {
  model_name: string;
  model_version?: string;
  id?: string;
  outputs: InferTensor[];
}

const baseUrl = process.env.SNOOZE_URL ?? "http://127.0.0.1:8080";
const apiKey = process.env.SNOOZE_API_KEY;

/** Sends a request with the API key; returns the JSON of a 2xx answer, or throws with the
 * daemon's `{"error": …}` message. */
async function call<T>(path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { "Content-Type": "application/json" };
  if (apiKey) {
    headers["X-API-Key"] = apiKey;
  }
  const response = await fetch(`${baseUrl}${path}`, {
    method: body === undefined ? "GET" : "POST",
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) {
    throw new Error(`${path}: HTTP ${response.status}: ${await response.text()}`);
  }
  return (await response.json()) as T;
}

/** One line per tensor: `classifier input: features FP32 [-1, 4]`. */
function describe(model: string, kind: string, tensor: TensorMetadata): string {
  return `${model} ${kind}: ${tensor.name} ${tensor.datatype} [${tensor.shape.join(", ")}]`;
}

/** Prints the name, datatype and shape of each input and output of a model. */
async function printMetadata(model: string): Promise<void> {
  const metadata = await call<ModelMetadata>(`/v2/models/${model}`);
  metadata.inputs.forEach((tensor) => console.log(describe(model, "input", tensor)));
  metadata.outputs.forEach((tensor) => console.log(describe(model, "output", tensor)));
}

/** Runs one FP32 input through a model and returns its first output. */
async function infer(
  model: string,
  input: string,
  shape: number[],
  data: number[],
): Promise<InferTensor> {
  const request: InferRequest = { inputs: [{ name: input, datatype: "FP32", shape, data }] };
  const response = await call<InferResponse>(`/v2/models/${model}/infer`, request);
  const output = response.outputs[0];
  if (output === undefined) {
    throw new Error(`${model} returned no outputs`);
  }
  return output;
}

/** Four decimals each, separated by spaces. */
function formatRow(values: number[]): string {
  return values.map((value) => value.toFixed(4)).join(" ");
}

async function main(): Promise<void> {
  // Readiness is public: it answers without a key even when auth is on.
  const { ready } = await call<{ ready: boolean }>("/v2/health/ready");
  console.log(`server ready: ${ready}`);

  // The classifier: two iris flowers (sepal length, sepal width, petal length, petal width in
  // cm) in one request; one row of class probabilities (setosa, versicolor, virginica) each.
  await printMetadata("classifier");
  const flowers = [5.1, 3.5, 1.4, 0.2, 6.7, 3.0, 5.2, 2.3];
  const probabilities = await infer("classifier", "features", [2, 4], flowers);
  const classes = probabilities.shape[1] ?? 0;
  for (let row = 0; row < (probabilities.shape[0] ?? 0); row++) {
    const values = probabilities.data.slice(row * classes, (row + 1) * classes);
    console.log(`classifier probabilities: ${formatRow(values)}`);
  }

  // The embedder: one row of 32 token features in, a unit-length 64-dim embedding out.
  await printMetadata("embedder");
  const tokens = Array.from({ length: 32 }, (_, i) => i / 32);
  const embedding = await infer("embedder", "tokens", [1, 32], tokens);
  console.log(`embedder embedding[0:4]: ${formatRow(embedding.data.slice(0, 4))}`);
}

main().catch((error: unknown) => {
  // fetch itself fails with "fetch failed"; the reason (connection refused, …) is its cause.
  const cause =
    error instanceof Error && error.cause instanceof Error ? ` (${error.cause.message})` : "";
  console.error(`error: ${error instanceof Error ? error.message : String(error)}${cause}`);
  process.exitCode = 1;
});
