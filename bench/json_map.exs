# The JSON-like map record of the dictionary benchmarks: string keys, a
# nested map and a list, about 200 bytes in Heft's term format (300 as
# JSON). Loaded with Code.require_file/2.
defmodule BenchJsonMap do
  def value(i) do
    %{
      "id" => i,
      "name" => "user-#{i}",
      "email" => "user-#{i}@example.com",
      "age" => rem(i, 90),
      "active" => rem(i, 3) != 0,
      "address" => %{
        "street" => "#{rem(i, 997)} Main Street",
        "city" => "Springfield",
        "zip" => "#{10_000 + rem(i, 89_999)}"
      },
      "tags" =>
        Enum.map(0..rem(i, 4), &Enum.at(~w(admin staff guest beta alpha), rem(i + &1, 5))),
      "created_at" => "2024-#{rem(i, 12) + 1}-#{rem(i, 28) + 1}T12:00:00Z"
    }
  end
end
