// A SnoozeML client in TypeScript over gRPC: server readiness, model metadata and inference on
// the demo models (the Open Inference Protocol v2), with @grpc/grpc-js and @grpc/proto-loader
// reading the project's own inference.proto at run time.
//
// Environment: SNOOZE_GRPC (default 127.0.0.1:8081) and, when the daemon has an [auth] table,
// SNOOZE_API_KEY (sent as the x-api-key metadata).
//
//   npx tsx src/grpc.ts

import { fileURLToPath } from "node:url";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

// The .proto of this repository, found from this file (examples/typescript/src/grpc.ts).
const PROTO = fileURLToPath(
  new URL("../../../src/snoozeml/proto/inference.proto", import.meta.url),
);

// The messages this client sends and reads, with the .proto's field names (keepCase below).
interface TensorMetadata {
  name: string;
  datatype: string;
  shape: number[]; // int64, read as numbers (longs: Number below); -1 is a dynamic dimension
}

interface ModelMetadataRequest {
  name: string;
}

interface ModelMetadataResponse {
  name: string;
  versions: string[];
  platform: string;
  inputs: TensorMetadata[];
  outputs: TensorMetadata[];
}

interface InferInputTensor {
  name: string;
  datatype: string;
  shape: number[];
  contents: { fp32_contents: number[] };
}

interface ModelInferRequest {
  model_name: string;
  inputs: InferInputTensor[];
}

interface ModelInferResponse {
  model_name: string;
  model_version: string;
  id: string;
  outputs: TensorMetadata[];
  raw_output_contents: Buffer[]; // one entry per output: little-endian bytes, row-major
}

const address = process.env.SNOOZE_GRPC ?? "127.0.0.1:8081";
const callMetadata = new grpc.Metadata(); // sent with every call
if (process.env.SNOOZE_API_KEY) {
  callMetadata.set("x-api-key", process.env.SNOOZE_API_KEY);
}

const definition = protoLoader.loadSync(PROTO, { keepCase: true, longs: Number, defaults: true });
const inference = grpc.loadPackageDefinition(definition).inference as grpc.GrpcObject;
const Service = inference.GRPCInferenceService as grpc.ServiceClientConstructor;
const client = new Service(address, grpc.credentials.createInsecure());

/** Calls one unary RPC with the API key in its metadata. */
function call<Request, Response>(rpc: string, request: Request): Promise<Response> {
  const method = client[rpc] as (
    request: Request,
    metadata: grpc.Metadata,
    callback: (error: grpc.ServiceError | null, response: Response) => void,
  ) => void;
  return new Promise((resolve, reject) => {
    method.call(client, request, callMetadata, (error, response) =>
      error ? reject(error) : resolve(response),
    );
  });
}

/** One line per tensor: `classifier input: features FP32 [-1, 4]`. */
function describe(model: string, kind: string, tensor: TensorMetadata): string {
  return `${model} ${kind}: ${tensor.name} ${tensor.datatype} [${tensor.shape.join(", ")}]`;
}

/** Prints the name, datatype and shape of each input and output of a model. */
async function printMetadata(model: string): Promise<void> {
  const request: ModelMetadataRequest = { name: model };
  const response = await call<ModelMetadataRequest, ModelMetadataResponse>(
    "ModelMetadata",
    request,
  );
  response.inputs.forEach((tensor) => console.log(describe(model, "input", tensor)));
  response.outputs.forEach((tensor) => console.log(describe(model, "output", tensor)));
}

/** Runs one FP32 input through a model; returns the first output's shape and values. */
async function infer(model: string, input: string, shape: number[], values: number[]) {
  const request: ModelInferRequest = {
    model_name: model,
    inputs: [{ name: input, datatype: "FP32", shape, contents: { fp32_contents: values } }],
  };
  const response = await call<ModelInferRequest, ModelInferResponse>("ModelInfer", request);
  // SnoozeML always answers with raw_output_contents, never with typed contents.
  const [output, raw] = [response.outputs[0], response.raw_output_contents[0]];
  if (output === undefined || raw === undefined) {
    throw new Error(`${model} returned no outputs`);
  }
  const data = Array.from({ length: raw.length / 4 }, (_, i) => raw.readFloatLE(4 * i));
  return { shape: output.shape, data };
}

/** Four decimals each, separated by spaces. */
function formatRow(values: number[]): string {
  return values.map((value) => value.toFixed(4)).join(" ");
}

async function main(): Promise<void> {
  // ServerReady is public: it answers without a key even when auth is on.
  const { ready } = await call<object, { ready: boolean }>("ServerReady", {});
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

main()
  .catch((error: unknown) => {
    console.error(`error: ${error instanceof Error ? error.message : String(error)}`);
    process.exitCode = 1;
  })
  .finally(() => client.close());
