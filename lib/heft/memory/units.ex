defmodule Heft.Memory.Units do
  # Bytes for people: binary units (KiB = 1024 B), three significant digits
  # at most ("992 KiB", "23.5 GiB", "4.40 MiB" is written "4.4 MiB"), a sign
  # for negative figures, "n/a" for nil (unavailable). The exact bytes stay
  # in the data; this is only for the printed report and messages.
  @moduledoc false

  @units ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]

  def format(nil), do: "n/a"
  def format(n) when is_integer(n) and n < 0, do: "-" <> format(-n)
  def format(n) when is_integer(n) and n < 1024, do: "#{n} B"

  def format(n) when is_integer(n) do
    exp = min(trunc(:math.log2(n) / 10), length(@units) - 1)
    value = n / Integer.pow(1024, exp)
    # 1023.6 KiB would round to "1024 KiB": say "1.0 MiB" instead.
    {value, exp} =
      if value >= 999.5 and exp < length(@units) - 1,
        do: {value / 1024, exp + 1},
        else: {value, exp}

    digits = if value < 99.95, do: 1, else: 0
    "#{:erlang.float_to_binary(value, decimals: digits)} #{Enum.at(@units, exp)}"
  end
end
