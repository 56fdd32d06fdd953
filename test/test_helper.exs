# Excluded by default:
# - :slow, long randomized runs:        mix test --include slow
# - :heft_accounting, loads millions of records (minutes, GiBs):
#                                       mix test --include heft_accounting
ExUnit.start(exclude: [:slow, :heft_accounting])
