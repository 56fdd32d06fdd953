# Excluded by default:
# - :slow, long randomized runs (incl. the large differential run):
#                                       mix test --include slow
# - :heft_accounting, loads millions of records (minutes, GiBs):
#                                       mix test --include heft_accounting
ExUnit.start(exclude: [:slow, :heft_accounting])

if Heft.Contract.heft_available?() do
  IO.puts("Heft contract: running every contract test against :ets and Heft")
else
  IO.puts(
    "Heft contract: Heft.new/2 is not implemented yet; the Heft variants are skipped " <>
      "and the differential test compares :ets against :ets (sanity run only)"
  )
end
