defmodule Heft.PersistWritebackTest do
  # A persistent table's arena is scratch: its log and snapshot are the
  # durable copy, so the kernel must not write the arena back to disk. The
  # arena is a memfd, whose pages are never written back. This checks it
  # from the kernel's own count of bytes this OS process caused to be
  # written (/proc/self/io write_bytes): loading data writes about the
  # log's bytes, not the log's plus the arena's. Not async: other tests'
  # file writes would count.
  use ExUnit.Case, async: false

  @moduletag :tmp_dir

  defp write_bytes do
    "/proc/self/io"
    |> File.read!()
    |> String.split("\n")
    |> Enum.find_value(fn line ->
      case String.split(line, ": ") do
        ["write_bytes", n] -> String.to_integer(n)
        _ -> nil
      end
    end)
  end

  test "loading a persistent table writes its log, not its arena", %{tmp_dir: tmp} do
    t = Heft.new(:wb, persist: Path.join(tmp, "t"), compression: :none)
    before = write_bytes()

    for c <- Enum.chunk_every(1..20_000, 500) do
      true = Heft.insert(t, Enum.map(c, &{&1, :crypto.strong_rand_bytes(1000)}))
    end

    :ok = Heft.sync(t)
    log = Heft.info(t, :log_bytes)
    arena = Heft.info(t, :arena_used_bytes)
    :ok = Heft.close(t)
    # Writeback of what close synced is done; count it.
    written = write_bytes() - before
    assert log > 20_000_000 and arena > 20_000_000

    assert written >= div(log * 9, 10),
           "the kernel counted #{written} bytes for a #{log}-byte log"

    assert written < log + div(arena, 2), "#{written} bytes written for a #{log}-byte log"
  end
end
