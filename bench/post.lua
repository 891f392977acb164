-- wrk script: POST one JSON body over and over, then print a one-line JSON summary.
--
--   wrk -t1 -c1 -d10s -s bench/post.lua http://127.0.0.1:8080/v2/models/mlp/infer -- body.json
--   SNOOZE_BENCH_BODY=body.json wrk -t1 -c1 -d10s -s bench/post.lua http://…/infer
--   wrk -t1 -c32 -d10s -s bench/post.lua http://…/infer -- body.bin 183
--
-- The body file comes from the first script argument (after "--") or, failing that, from the
-- SNOOZE_BENCH_BODY environment variable. A second script argument N makes it a binary tensor
-- data extension body: its first N bytes are the JSON header, and the request carries
-- `Inference-Header-Content-Length: N` and `Content-Type: application/octet-stream`.
-- done() writes, as the last line of stdout:
--   {"p50_ms":…,"p90_ms":…,"p99_ms":…,"max_ms":…,"mean_ms":…,"requests":…,"duration_s":…,
--    "requests_per_s":…,"non_2xx":…,"socket_errors":…}
-- Latency is wrk's: from writing the request to reading the whole response.

local function read_file(path)
   local file, err = io.open(path, "rb")
   if not file then
      error("post.lua: cannot open body file: " .. tostring(err))
   end
   local body = file:read("*a")
   file:close()
   return body
end

local function body_path(args)
   if args ~= nil and args[1] ~= nil and args[1] ~= "" then
      return args[1]
   end
   local from_env = os.getenv("SNOOZE_BENCH_BODY")
   if from_env ~= nil and from_env ~= "" then
      return from_env
   end
   error("post.lua: give the JSON body file after '--' or in SNOOZE_BENCH_BODY")
end

-- Runs once per wrk thread, before wrk builds the (static) request from wrk.method/body/headers.
function init(args)
   wrk.method = "POST"
   wrk.body = read_file(body_path(args))
   if args ~= nil and args[2] ~= nil and args[2] ~= "" then
      wrk.headers["Content-Type"] = "application/octet-stream"
      wrk.headers["Inference-Header-Content-Length"] = args[2]
   else
      wrk.headers["Content-Type"] = "application/json"
   end
end

function done(summary, latency, requests)
   local errors = summary.errors
   local socket_errors = errors.connect + errors.read + errors.write + errors.timeout
   local seconds = summary.duration / 1e6
   local rps = 0
   if seconds > 0 then
      rps = summary.requests / seconds
   end
   io.write(string.format(
      '{"p50_ms":%.4f,"p90_ms":%.4f,"p99_ms":%.4f,"max_ms":%.4f,"mean_ms":%.4f,'
         .. '"requests":%d,"duration_s":%.3f,"requests_per_s":%.2f,"non_2xx":%d,'
         .. '"socket_errors":%d}\n',
      latency:percentile(50) / 1000, latency:percentile(90) / 1000,
      latency:percentile(99) / 1000, latency.max / 1000, latency.mean / 1000,
      summary.requests, seconds, rps, errors.status, socket_errors
   ))
end
