# Excluded by default:
# - :slow, long randomized runs (incl. the large differential run):
#                                       mix test --include slow
# - :heft_accounting, loads millions of records (minutes, GiBs):
#                                       mix test --include heft_accounting
# assert_receive waits up to 5 s (ExUnit's default, 100 ms, is shorter than
# a table's creation and load on a loaded 2-core host); it returns as soon
# as the message is there, so passing tests take no longer.
# Mix 1.15 and later keep only the applications a project lists on the code
# path; the tests use Mnesia and xmerl, which Heft does not depend on.
if function_exported?(Mix, :ensure_application!, 1),
  do: Enum.each([:mnesia, :xmerl], &apply(Mix, :ensure_application!, [&1]))

ExUnit.start(exclude: [:slow, :heft_accounting], assert_receive_timeout: 5_000)

if Heft.Contract.heft_available?() do
  IO.puts("Heft contract: running every contract test against :ets and Heft")
else
  IO.puts(
    "Heft contract: Heft.new/2 is not implemented yet; the Heft variants are skipped " <>
      "and the differential test compares :ets against :ets (sanity run only)"
  )
end
