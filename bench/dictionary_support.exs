# What the dictionary benchmarks (bench/dictionary_*.exs) share, the
# harness's record kinds among them. Loaded with Code.require_file/2.
Code.require_file("harness.exs", __DIR__)

defmodule BenchDictionary do
  @doc "Inserts `record.(i)` for each i of `range`, 500 records a call."
  def fill(t, range, record) do
    Enum.each(Enum.chunk_every(range, 500), fn c ->
      Heft.insert(t, Enum.map(c, record))
    end)
  end

  @doc "Waits for the table's training and re-compression to be over; their last state."
  def settle(t) do
    Stream.repeatedly(fn ->
      Process.sleep(10)
      Heft.info(t, :recompression).state
    end)
    |> Enum.find(&(&1 in [:done, :failed, :idle]))
  end

  @doc """
  The JSON-like map record: string keys, a nested map and a list, about
  200 bytes in Heft's term format (300 as JSON).
  """
  def json_map(i) do
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
