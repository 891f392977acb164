//! A SnoozeML client in Rust: server readiness, model metadata and inference on the demo
//! models over HTTP (the Open Inference Protocol v2, JSON tensors), with ureq and serde.
//!
//! Environment: SNOOZE_URL (default http://127.0.0.1:8080) and, when the daemon has an
//! [auth] table, SNOOZE_API_KEY (sent as the X-API-Key header).

use std::env;
use std::process::ExitCode;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

// The Open Inference Protocol's JSON, as far as this client reads it.
#[derive(Deserialize)]
struct Ready {
    ready: bool,
}

#[derive(Deserialize)]
struct TensorMetadata {
    name: String,
    datatype: String,
    shape: Vec<i64>, // -1 is a dynamic dimension
}

#[derive(Deserialize)]
struct ModelMetadata {
    inputs: Vec<TensorMetadata>,
    outputs: Vec<TensorMetadata>,
}

#[derive(Deserialize)]
struct InferOutput {
    shape: Vec<usize>,
    data: Vec<f64>, // row-major, flat
}

#[derive(Deserialize)]
struct InferResponse {
    outputs: Vec<InferOutput>,
}

/// The daemon's base URL and the API key to send, if any.
struct Client {
    base: String,
    api_key: Option<String>,
}

impl Client {
    fn from_env() -> Self {
        Client {
            base: env::var("SNOOZE_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".to_string()),
            api_key: env::var("SNOOZE_API_KEY")
                .ok()
                .filter(|key| !key.is_empty()),
        }
    }

    /// Sends a GET, or a POST of `body`, with the API key; returns the JSON of a 2xx answer.
    /// Any other status is an error carrying the daemon's `{"error": …}` message.
    fn call<T: DeserializeOwned>(&self, path: &str, body: Option<Value>) -> Result<T, String> {
        let url = format!("{}{path}", self.base);
        let mut request = match body {
            Some(_) => ureq::post(&url),
            None => ureq::get(&url),
        };
        if let Some(key) = &self.api_key {
            request = request.set("X-API-Key", key);
        }
        let answer = match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        };
        match answer {
            Ok(response) => response.into_json().map_err(|e| format!("{url}: {e}")),
            Err(ureq::Error::Status(status, response)) => {
                let text = response.into_string().unwrap_or_default();
                Err(format!("{url}: HTTP {status}: {text}"))
            }
            Err(error) => Err(format!("{url}: {error}")),
        }
    }

    /// Prints the name, datatype and shape of each input and output of a model.
    fn print_metadata(&self, model: &str) -> Result<(), String> {
        let metadata: ModelMetadata = self.call(&format!("/v2/models/{model}"), None)?;
        for (kind, tensors) in [("input", metadata.inputs), ("output", metadata.outputs)] {
            for tensor in tensors {
                // {:?} prints the shape as [-1, 4]
                println!(
                    "{model} {kind}: {} {} {:?}",
                    tensor.name, tensor.datatype, tensor.shape
                );
            }
        }
        Ok(())
    }

    /// Runs one FP32 input of `shape` through a model and returns its first output.
    fn infer(
        &self,
        model: &str,
        input: &str,
        shape: [usize; 2],
        data: &[f32],
    ) -> Result<InferOutput, String> {
        let request = json!({
            "inputs": [{"name": input, "shape": shape, "datatype": "FP32", "data": data}],
        });
        let response: InferResponse =
            self.call(&format!("/v2/models/{model}/infer"), Some(request))?;
        response
            .outputs
            .into_iter()
            .next()
            .ok_or(format!("{model} returned no outputs"))
    }
}

/// Four decimals each, separated by spaces.
fn format_row(values: &[f64]) -> String {
    let values: Vec<String> = values.iter().map(|v| format!("{v:.4}")).collect();
    values.join(" ")
}

fn run() -> Result<(), String> {
    let client = Client::from_env();

    // Readiness is public: it answers without a key even when auth is on.
    let Ready { ready } = client.call("/v2/health/ready", None)?;
    println!("server ready: {ready}");

    // The classifier: two iris flowers (sepal length, sepal width, petal length, petal width
    // in cm) in one request; one row of class probabilities (setosa, versicolor, virginica) each.
    client.print_metadata("classifier")?;
    let flowers = [5.1, 3.5, 1.4, 0.2, 6.7, 3.0, 5.2, 2.3];
    let probabilities = client.infer("classifier", "features", [2, 4], &flowers)?;
    for row in probabilities.data.chunks(probabilities.shape[1]) {
        println!("classifier probabilities: {}", format_row(row));
    }

    // The embedder: one row of 32 token features in, a unit-length 64-dim embedding out.
    client.print_metadata("embedder")?;
    let tokens: Vec<f32> = (0..32).map(|i| i as f32 / 32.0).collect();
    let embedding = client.infer("embedder", "tokens", [1, 32], &tokens)?;
    println!(
        "embedder embedding[0:4]: {}",
        format_row(&embedding.data[..4])
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
