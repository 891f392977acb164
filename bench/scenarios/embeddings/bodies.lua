-- wrk script of the embeddings scenario: POST one JSON body per line of the file named after
-- "--", in turn (each thread starts elsewhere in the list); at the end one JSON line.
local requests = {}
local position = 1
local threads = 0

function setup(thread)
   thread:set("id", threads)
   threads = threads + 1
end

function init(args)
   wrk.method = "POST"
   wrk.headers["Content-Type"] = "application/json"
   local file = assert(io.open(args[1], "rb"))
   for line in file:lines() do
      if #line > 0 then
         requests[#requests + 1] = wrk.format(nil, nil, nil, line)
      end
   end
   file:close()
   if #requests == 0 then
      error("no request bodies in " .. args[1])
   end
   position = ((id or 0) * 97) % #requests + 1
end

function request()
   local r = requests[position]
   position = position % #requests + 1
   return r
end

function done(summary, latency, requests_done)
   local errors = summary.errors
   local socket_errors = errors.connect + errors.read + errors.write + errors.timeout
   local seconds = summary.duration / 1e6
   io.write(string.format(
      '{"p50_ms":%.4f,"p99_ms":%.4f,"max_ms":%.4f,"requests":%d,"duration_s":%.3f,'
         .. '"non_2xx":%d,"socket_errors":%d}\n',
      latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
      summary.requests, seconds, errors.status, socket_errors
   ))
end
