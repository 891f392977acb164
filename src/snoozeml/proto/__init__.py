"""Generated gRPC modules (`make proto`) and the .proto files they come from."""
