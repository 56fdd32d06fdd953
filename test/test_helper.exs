# :slow tests (the large differential run) are excluded by default:
#   mix test --include slow
ExUnit.start(exclude: [:slow])

if Heft.Contract.heft_available?() do
  IO.puts("Heft contract: running every contract test against :ets and Heft")
else
  IO.puts(
    "Heft contract: Heft.new/2 is not implemented yet; the Heft variants are skipped " <>
      "and the differential test compares :ets against :ets (sanity run only)"
  )
end
