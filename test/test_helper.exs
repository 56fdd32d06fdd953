# :heft_accounting loads millions of records (minutes, GiBs): run it with
#   mix test --include heft_accounting
ExUnit.start(exclude: [:heft_accounting])
