# :slow tests run with `mix test --include slow`; :tmpfs tests mount a small
# tmpfs and need root (they skip themselves otherwise).
ExUnit.start(exclude: [:slow])
